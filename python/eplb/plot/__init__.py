"""Pictures an operator would rather look at than read (matplotlib; PNG, SVG, PDF by extension).

Contract: `rank_loads` draws how a placement spreads a load over the ranks,
before and after a rebalance, layer by layer: two heatmaps of rank load /
the layer's mean rank load (red: overloaded, blue: idle, white: even) on one
color scale, and the per-layer balancedness before and after. `evaluate`
draws the results of `eplb evaluate --json`: out-of-sample balancedness per
window for every policy, and the bytes each rebalance moved. Both return a
matplotlib Figure (no pyplot, no global state) and write it to `out` when
given. `timeline` (eplb/plot/timeline.py) draws an async `eplb run` report's
serving step times with the layer commits marked. The shell entry point is
`python3 -m eplb.plot rank-loads|evaluate|timeline` (eplb/plot/__main__.py).
Bad input raises eplb.Error: files are read as untrusted (regular files only,
size-capped, UTF-8, every field drawn type-checked and named; eplb/plot/_inputs.py).
"""
import os

import numpy as np

from eplb.balance import balancedness, rank_loads as _rank_loads
from eplb.errors import Error
from eplb.plot import _inputs

__all__ = ["rank_loads", "evaluate", "timeline", "default_phy2log", "save"]


def default_phy2log(num_layers: int, num_experts: int, num_replicas: int) -> np.ndarray:
    """The default placement (slot s holds expert s mod experts), [layers, replicas] int64."""
    return np.tile(np.arange(num_replicas, dtype=np.int64) % num_experts, (num_layers, 1))


def save(figure, out) -> None:
    """Writes `figure` to `out`; the format follows the extension (.png, .svg, .pdf, ...)."""
    path = os.fspath(out)
    extension = os.path.splitext(path)[1].lstrip(".").lower()
    supported = figure.canvas.get_supported_filetypes()
    if extension not in supported:
        raise Error(f"{path}: unsupported picture format {extension!r} (use one of {', '.join(sorted(supported))})")
    try:
        figure.savefig(path, dpi=110, bbox_inches="tight")
    except OSError as failure:
        raise Error(f"{path}: cannot write: {failure}", "I/O error") from None


def _figure(width: float, height: float):
    from matplotlib.figure import Figure

    return Figure(figsize=(width, height), layout="constrained")


def _relative(load: np.ndarray) -> np.ndarray:
    mean = load.mean(axis=1, keepdims=True)
    return np.divide(load, mean, out=np.ones_like(load), where=mean > 0)


def _heatmaps(figure, axes, before: np.ndarray, after: np.ndarray, titles) -> None:
    """Rank load / mean, 0 (idle, blue) .. 1 (even, white) .. 2 or more (twice the mean, red)."""
    from matplotlib.colors import TwoSlopeNorm

    relative = [_relative(before), _relative(after)]
    norm = TwoSlopeNorm(vmin=0.0, vcenter=1.0, vmax=2.0)
    for axis, values, title in zip(axes, relative, titles):
        image = axis.imshow(values, aspect="auto", cmap="RdBu_r", norm=norm, interpolation="nearest")
        axis.set_title(title)
        axis.set_xlabel("rank")
        axis.set_ylabel("layer")
    extend = "max" if max(float(r.max()) for r in relative) > 2.0 else "neither"
    figure.colorbar(image, ax=list(axes), label="rank load / layer's mean rank load", shrink=0.9, extend=extend)


def rank_loads(load, after, num_ranks, *, before=None, title=None, out=None):
    """Rank loads before and after a rebalance, per layer.

    Args:
        load: the load [layers, experts] (or a window [steps, layers, experts], summed).
        after: the new placement, phy2log [layers, slots].
        num_ranks: ranks.
        before: the placement in force (default: slot s holds expert s mod experts).
        title: the figure's title (default: the balancedness before -> after).
        out: write the picture there (.png, .svg, ...).

    Returns:
        the matplotlib Figure.
    """
    after = np.asarray(after)
    if before is None:
        layers, experts = np.shape(load)[-2:]
        before = default_phy2log(layers, experts, after.shape[-1])
    summary = [balancedness(load, placement, num_ranks) for placement in (before, after)]
    loads = [np.asarray(_rank_loads(load, placement, num_ranks)) for placement in (before, after)]
    figure = _figure(11, 8)
    grid = figure.add_gridspec(2, 2, height_ratios=[3, 2])
    heat = [figure.add_subplot(grid[0, 0]), figure.add_subplot(grid[0, 1])]
    _heatmaps(figure, heat, loads[0], loads[1], [f"before: balancedness {summary[0].mean:.3f}",
                                                 f"after: balancedness {summary[1].mean:.3f}"])
    lines = figure.add_subplot(grid[1, :])
    for label, result, style in (("before", summary[0], "o-"), ("after", summary[1], "s-")):
        lines.plot(np.asarray(result.per_layer), style, markersize=3, label=f"{label} (mean {result.mean:.3f})")
    lines.set_xlabel("layer")
    lines.set_ylabel("balancedness (mean / max rank load)")
    lines.set_ylim(0, 1.05)
    lines.grid(alpha=0.3)
    lines.legend(loc="lower right")
    figure.suptitle(title or f"rank loads on {num_ranks} ranks: balancedness {summary[0].mean:.3f} -> "
                             f"{summary[1].mean:.3f} (mean over layers; 1.0 is perfect)")
    if out is not None:
        save(figure, out)
    return figure


def _evaluate_results(results, max_input_bytes=None) -> dict:
    """A report given as a dict, or read from a path as untrusted input (eplb.plot._inputs)."""
    if isinstance(results, dict):
        return results
    return _inputs.read_json(results, _inputs.DEFAULT_MAX_BYTES if max_input_bytes is None else max_input_bytes)


def _check_evaluate(data: dict, source: str) -> None:
    """Every field evaluate() draws has its type; eplb.Error naming the first that does not."""
    _inputs.optional(data, "topology", "object", "topology", source)
    if not data.get("policies"):
        raise Error(f"{source}: not `eplb evaluate --json` output (no 'policies')", "parse error")
    for p, policy in enumerate(_inputs.expect(data["policies"], "list", "policies", source)):
        where = f"policies[{p}]"
        _inputs.expect(policy, "object", where, source)
        for key, kind in (("policy", "string"), ("windows", "list")):
            if key not in policy:
                raise Error(f"{source}: {where}: not `eplb evaluate --json` output (missing '{key}')", "parse error")
            _inputs.expect(policy[key], kind, f"{where}.{key}", source)
        for w, window in enumerate(policy["windows"]):
            _inputs.expect(window, "object", f"{where}.windows[{w}]", source)
            for key in ("boundary", "next_window", "bytes_moved"):
                if key not in window:
                    raise Error(f"{source}: {where}.windows[{w}]: missing '{key}'", "parse error")
                _inputs.expect(window[key], "number", f"{where}.windows[{w}].{key}", source)


def _policy_series(policy: dict, source: str):
    windows = policy["windows"]
    return (policy["policy"], [w["boundary"] for w in windows], [w["next_window"] for w in windows],
            [w["bytes_moved"] / 1e9 for w in windows])


def evaluate(results, *, title=None, out=None, max_input_bytes=None):
    """Balancedness per window per policy, and bytes moved, from `eplb evaluate --json` output.

    Args:
        results: the JSON file's path, or its content as a dict.
        title: the figure's title (default: trace, window, estimator, topology).
        out: write the picture there (.png, .svg, ...).
        max_input_bytes: the largest file read (default 1 GiB); only regular files are read.

    Returns:
        the matplotlib Figure.

    Raises:
        eplb.Error: an unreadable file, or a field of the wrong type (named).
    """
    data = _evaluate_results(results, max_input_bytes)
    source = os.fspath(results) if not isinstance(results, dict) else "results"
    _check_evaluate(data, source)
    figure = _figure(11, 7)
    balance, moved = figure.subplots(2, 1, sharex=True)
    for index, policy in enumerate(data["policies"]):
        name, steps, next_window, gigabytes = _policy_series(policy, source)
        style = dict(marker="os^dv"[index % 5], linestyle=["-", "--", "-.", ":"][index % 4], markersize=4)
        balance.plot(steps, next_window, label=f"{name} (mean {np.mean(next_window):.3f})", **style)
        moved.plot(steps, gigabytes, label=f"{name} (mean {np.mean(gigabytes):.1f} GB)", **style)
    balance.set_ylabel("balancedness on the next window")
    balance.grid(alpha=0.3)
    balance.legend(loc="lower right", fontsize="small")
    moved.set_ylabel("bytes moved per rebalance (GB)")
    moved.set_xlabel("step (window boundary)")
    moved.grid(alpha=0.3)
    moved.set_ylim(bottom=0)
    moved.legend(loc="center right", fontsize="small")
    figure.suptitle(title or _evaluate_title(data))
    if out is not None:
        save(figure, out)
    return figure


def _evaluate_title(data: dict) -> str:
    topology = data.get("topology", {})
    shape = " ".join(f"{key}={topology[key]}" for key in ("layers", "experts", "slots", "nodes", "ranks")
                     if key in topology)
    return (f"eplb evaluate: {os.path.basename(str(data.get('trace', '?')))}, window {data.get('window', '?')}, "
            f"estimator {data.get('estimator', '?')}; {shape}")


from eplb.plot.timeline import timeline  # noqa: E402  (uses the helpers above)
