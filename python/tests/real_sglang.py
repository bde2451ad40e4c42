"""SGLang's own EPLB algorithm modules, imported from the installed sglang package's files.

Contract: `algorithms()` returns the real `sglang.srt.eplb.eplb_algorithms` package (its
`__init__` with `EplbAlgorithm` and `rebalance_experts`, and the submodules `deepseek`,
`deepseek_vec`, `elasticity_aware`), executed from the installed files unchanged, or None
when sglang is not installed. `sglang/__init__.py` (which imports FlashInfer, transformers
patches and the serving runtime, unusable without a GPU stack) is not run: the enclosing
packages `sglang`, `sglang.srt` and `sglang.srt.eplb` are bare package objects whose
`__path__` is the installed directory, present in sys.modules only while the modules load.
Nothing of the algorithms is replaced. `version()` is the installed distribution's version.
"""
import importlib
import importlib.metadata
import importlib.util
import os
import sys
import types

_PACKAGES = ("sglang", "sglang.srt", "sglang.srt.eplb")
_MODULES = ("sglang.srt.eplb.eplb_algorithms", "sglang.srt.eplb.eplb_algorithms.deepseek",
            "sglang.srt.eplb.eplb_algorithms.deepseek_vec", "sglang.srt.eplb.eplb_algorithms.elasticity_aware")
_loaded = None


def version():
    try:
        return importlib.metadata.version("sglang")
    except importlib.metadata.PackageNotFoundError:
        return None


def _root():
    spec = importlib.util.find_spec("sglang") if "sglang" not in sys.modules else None
    if spec is None or not spec.submodule_search_locations:
        return None
    return list(spec.submodule_search_locations)[0]


def algorithms():
    """The real sglang.srt.eplb.eplb_algorithms module (None without sglang)."""
    global _loaded
    if _loaded is not None:
        return _loaded
    root = _root()
    if root is None:
        return None
    saved = {name: sys.modules.get(name) for name in _PACKAGES + _MODULES}
    try:
        directory = root
        for name in _PACKAGES:
            if name != "sglang":
                directory = os.path.join(directory, name.rsplit(".", 1)[1])
            package = types.ModuleType(name)
            package.__path__ = [directory]
            sys.modules[name] = package
        _loaded = importlib.import_module("sglang.srt.eplb.eplb_algorithms")
    finally:
        for name, module in saved.items():
            if module is None:
                sys.modules.pop(name, None)
            else:
                sys.modules[name] = module
    return _loaded
