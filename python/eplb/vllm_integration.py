"""eplb inside vLLM's own code paths (written against vllm 0.33.0; docs/python.md, Interoperability).

Contract:
- `plugin()` is the `vllm.general_plugins` entry point (pyproject.toml: `eplb = "eplb.vllm:plugin"`),
  which vLLM's `load_general_plugins()` calls in every vLLM process once eplb is pip-installed. From
  the environment:
  - EPLB_VLLM_POLICY (default "deepseek"): the eplb policy behind vLLM's "default" entry of
    `EPLB_POLICIES`, the only name `EPLBConfig.policy` accepts (and the only one async EPLB runs):
    deepseek, relabel, incremental, balanced or cost-aware; "vllm" leaves vLLM's own DefaultEplbPolicy in place.
  - EPLB_VLLM_COMMUNICATOR (default unset: vLLM's communicators untouched): "all", or a comma-separated
    list of vLLM's backend names (`EPLBConfig.communicator`), makes those names produce eplb's
    communicator (install()).
  - EPLB_VLLM_ESTIMATOR (default "sum": vLLM sums its load window, as without eplb): "auto", "ema:H" or
    "robust:Z" makes the policy plan from that estimator over vLLM's window cut into EPLB_VLLM_WINDOW_CHUNKS
    (default 20) chunks of consecutive steps (eplb/vllm_window.py, install_window).
  A bad value raises eplb.Error naming the variable and the accepted values; vLLM's loader lets it
  through, so vLLM stops at start-up with that message.
- `communicator_class()`: eplb.vllm.EplbCommunicator. When vllm is importable, a subclass of vLLM's
  abstract `vllm.distributed.eplb.eplb_communicator.EplbCommunicator` (imported on first use: vLLM's
  import takes seconds); without vllm, eplb's own class (eplb/communicator.py).
- `install(backends="all", **options)`: vLLM's `EPLBConfig.communicator` is a Literal with no hook,
  so install() replaces `create_eplb_communicator` wherever vLLM holds it (its own module and every
  loaded vllm module that imported it by name, e.g. eplb_state): for the given backend names the
  factory returns eplb's communicator over the group coordinator's `cpu_group`, for the others vLLM's
  own. `uninstall()` puts vLLM's factory back.
"""
from __future__ import annotations

import importlib
import os
import sys
import typing

from eplb.errors import Error

POLICY_VARIABLE = "EPLB_VLLM_POLICY"
COMMUNICATOR_VARIABLE = "EPLB_VLLM_COMMUNICATOR"
ESTIMATOR_VARIABLE = "EPLB_VLLM_ESTIMATOR"
CHUNKS_VARIABLE = "EPLB_VLLM_WINDOW_CHUNKS"
DEFAULT_WINDOW_CHUNKS = 20
#: EPLB_VLLM_POLICY's value that keeps vLLM's own DefaultEplbPolicy.
VLLM_OWN_POLICY = "vllm"

_FACTORY = "create_eplb_communicator"
_FACTORY_MODULE = "vllm.distributed.eplb.eplb_communicator"
_communicator_class = None
_vllm_factory = None  # vLLM's own create_eplb_communicator while install() is in force
_installed = None  # the factory install() put in its place


def plugin() -> None:
    """vLLM's general plugin: selects eplb's policy and, if asked, its communicator and the estimator over vLLM's
    load window (module docstring)."""
    from eplb import vllm

    policy = os.environ.get(POLICY_VARIABLE, "") or "deepseek"
    choices = sorted(vllm.POLICY_CLASSES) + [VLLM_OWN_POLICY]
    if policy not in choices:
        raise Error(f"{POLICY_VARIABLE}={policy!r} is not an eplb policy for vLLM: use one of "
                    f"{', '.join(choices)} ('{VLLM_OWN_POLICY}' keeps vLLM's DefaultEplbPolicy; unset means deepseek)")
    communicator = os.environ.get(COMMUNICATOR_VARIABLE, "").strip()
    backends = None
    if communicator:
        backends = [name.strip() for name in communicator.split(",")]
        _check_backends(backends, f"{COMMUNICATOR_VARIABLE}={communicator!r}")
    window = _window_settings()
    if policy != VLLM_OWN_POLICY:
        vllm.register(policy)
    if backends is not None:
        install(backends)
    if window is not None:
        vllm.install_window(*window)


def _window_settings():
    """(estimator, chunks) from EPLB_VLLM_ESTIMATOR and EPLB_VLLM_WINDOW_CHUNKS; None for vLLM's own sum."""
    estimator = os.environ.get(ESTIMATOR_VARIABLE, "").strip() or "sum"
    text = os.environ.get(CHUNKS_VARIABLE, "").strip()
    if text and not (text.isascii() and text.isdecimal() and int(text) >= 1):
        raise Error(f"{CHUNKS_VARIABLE}={text!r} must be a positive integer (unset means {DEFAULT_WINDOW_CHUNKS})")
    chunks = int(text) if text else DEFAULT_WINDOW_CHUNKS
    if estimator == "sum":
        return None
    from eplb.vllm_window import check_window_settings

    try:
        check_window_settings(estimator, chunks)
    except Error as bad:
        raise Error(f"{ESTIMATOR_VARIABLE}={estimator!r}: {bad} (unset or 'sum' keeps vLLM's window sum)") from None
    return estimator, chunks


def communicator_class() -> type:
    """eplb.vllm.EplbCommunicator: vLLM's EplbCommunicator subclass when vllm is importable."""
    global _communicator_class
    if _communicator_class is None:
        from eplb.communicator import EplbCommunicator as Protocol

        base = _vllm_module(_FACTORY_MODULE)
        if base is None:
            _communicator_class = Protocol
        else:
            class EplbCommunicator(Protocol, base.EplbCommunicator):
                __doc__ = Protocol.__doc__
                __module__ = "eplb.vllm"
                __qualname__ = "EplbCommunicator"

            _communicator_class = EplbCommunicator
    return _communicator_class


def install(backends="all", *, timeout: float = 30.0, retries: int = 2, transport: str = "auto") -> list[str]:
    """Makes vLLM's communicator factory return eplb's communicator for `backends`.

    Args:
        backends: "all", or names of vLLM's EPLB communicator backends (`EPLBConfig.communicator`:
            torch_nccl, torch_gloo, torch_xccl, nixl, pynccl in vllm 0.33.0); a config naming one of them
            (or left unset, which vLLM resolves to one of them) then gets eplb's.
        timeout, retries, transport: eplb.vllm.EplbCommunicator's options.

    Returns:
        the backend names that now produce eplb's communicator. Calling install() again replaces the
        selection; uninstall() restores vLLM's factory.
    """
    names = _check_backends([backends] if isinstance(backends, str) else list(backends), "install()")
    module = _vllm_module(_FACTORY_MODULE)
    if module is None:
        raise Error("eplb.vllm.install(): vllm is not importable", "unsupported")
    global _vllm_factory, _installed
    original = _vllm_factory or getattr(module, _FACTORY)
    cls = communicator_class()
    options = {"timeout": timeout, "retries": retries, "transport": transport}

    def create_eplb_communicator(group_coordinator, backend, expert_weights, expert_buffer):
        if backend not in names:
            return original(group_coordinator, backend, expert_weights, expert_buffer)
        if isinstance(group_coordinator, module.StatelessGroupCoordinator):
            raise Error(f"EPLB communicator {backend!r} is eplb's (eplb.vllm.install): it needs a torch.distributed "
                        "gloo group, and vLLM's elastic EP (stateless groups) has none", "unsupported")
        on_device = bool(expert_weights) and expert_weights[0][0].device.type != "cpu"
        data_group = group_coordinator.device_group if on_device else None
        return cls(group_coordinator.cpu_group, expert_weights, expert_buffer, data_group=data_group, **options)

    create_eplb_communicator.__doc__ = f"vLLM's factory, with eplb's communicator for {', '.join(names)}."
    _replace_factory(_installed or original, create_eplb_communicator)
    _vllm_factory, _installed = original, create_eplb_communicator
    return names


def uninstall() -> bool:
    """Puts vLLM's own create_eplb_communicator back everywhere install() replaced it; False if none was."""
    global _vllm_factory, _installed
    if _vllm_factory is None:
        return False
    _replace_factory(_installed, _vllm_factory)
    _vllm_factory = _installed = None
    return True


def _replace_factory(old, new) -> None:
    """Points every loaded vllm module's `create_eplb_communicator` that is `old` at `new`."""
    for name, module in list(sys.modules.items()):
        if (name == "vllm" or name.startswith("vllm.")) and getattr(module, _FACTORY, None) is old:
            setattr(module, _FACTORY, new)


def _check_backends(names: list, where: str) -> list[str]:
    """The selected backend names (every one of vLLM's for "all"); eplb.Error for an unknown name."""
    known = _vllm_backends()
    if names == ["all"]:
        return sorted(known)
    unknown = [name for name in names if name not in known]
    if unknown or not names:
        raise Error(f"{where}: {', '.join(map(repr, unknown)) or 'no name'} is not an EPLB communicator backend of "
                    f"vLLM: use 'all' or names among {', '.join(known)}")
    return sorted(set(names))


def _vllm_backends() -> list[str]:
    config = _vllm_module("vllm.config.parallel")
    if config is None:
        raise Error("eplb's vLLM communicator: vllm is not importable", "unsupported")
    return list(typing.get_args(config.EPLBCommunicatorBackend))


def _vllm_module(name: str):
    """vLLM's module `name`, or None when vllm itself is not installed (other import errors propagate)."""
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as missing:
        if missing.name and missing.name.split(".")[0] == "vllm":
            return None
        raise
