"""eplb.plot.timeline: "did rebalancing hurt my latency?" from an `eplb run --async --json` report.

Contract: `timeline(report, *, round=None, title=None, out=None)` draws, one panel per round that
has a "serving_timeline" (or only round `round`, numbered as the report's "round" keys, from 1),
each serving step's time against the time the step ended in the round, the part of it stalled
inside eplb calls, and a marker per layer commit at its step; the panel title carries the round's
"serving" summary (p50, p99, stall total and max, inconsistent reads) and a dashed line the
"serving_idle" p50 when the report has it. It returns the matplotlib Figure and writes it to
`out` when given. A report without a serving timeline (a synchronous run) or a malformed one
raises eplb.Error naming what is missing; a field of the wrong type raises eplb.Error naming the field.
"""
from __future__ import annotations

import numpy as np

from eplb.errors import Error
from eplb.plot import _inputs

__all__ = ["timeline"]

SERIES = ("step_end_seconds", "step_seconds", "stall_seconds")


_SERVING = ("steps", "step_seconds_p50", "step_seconds_p99", "stall_seconds_total", "stall_seconds_max",
            "inconsistent_reads")


def _check_round(round_, where: str, source: str) -> None:
    """The fields of one round that are drawn: their types, or eplb.Error naming the first wrong one."""
    _inputs.expect(round_, "object", where, source)
    _inputs.optional(round_, "round", "integer", f"{where}.round", source)
    serving = _inputs.optional(round_, "serving", "object", f"{where}.serving", source) or {}
    for key in _SERVING:
        _inputs.optional(serving, key, "number", f"{where}.serving.{key}", source)
    timeline = round_.get("serving_timeline")
    if timeline is None:
        return
    _inputs.expect(timeline, "object", f"{where}.serving_timeline", source)
    for key in SERIES:
        if key in timeline:
            _inputs.numbers(timeline[key], f"{where}.serving_timeline.{key}", source)
    commits = _inputs.optional(timeline, "commits", "list", f"{where}.serving_timeline.commits", source) or []
    for c, commit in enumerate(commits):
        at = f"{where}.serving_timeline.commits[{c}]"
        _inputs.expect(commit, "object", at, source)
        for key, kind in (("layer", "integer"), ("step", "integer"), ("seconds", "number")):
            _inputs.optional(commit, key, kind, f"{at}.{key}", source)


def _check_report(data: dict, source: str) -> None:
    """Every field timeline() draws has its type; eplb.Error naming the first that does not."""
    _inputs.optional(data, "topology", "object", "topology", source)
    for key in ("policy", "commit"):
        _inputs.optional(data, key, "string", key, source)
    idle = _inputs.optional(data, "serving_idle", "object", "serving_idle", source) or {}
    _inputs.optional(idle, "step_seconds_p50", "number", "serving_idle.step_seconds_p50", source)
    if "rounds" not in data:
        raise Error(f"{source}: not an `eplb run --json` report (no 'rounds')", "parse error")
    for index, round_ in enumerate(_inputs.expect(data["rounds"], "list", "rounds", source)):
        _check_round(round_, f"rounds[{index}]", source)


def _rounds_with_timeline(data: dict, source: str, chosen) -> list:
    _check_report(data, source)
    rounds = data["rounds"]
    if chosen is not None:
        rounds = [r for r in rounds if isinstance(r, dict) and r.get("round") == chosen]
        if not rounds:
            raise Error(f"{source}: has no round {chosen}")
    with_timeline = [r for r in rounds if isinstance(r, dict) and r.get("serving_timeline")]
    if not with_timeline:
        which = f"round {chosen}" if chosen is not None else "no round"
        raise Error(f"{source}: {which} has a serving timeline ('serving_timeline'): a synchronous run? "
                    "Draw the report of `eplb run --async ... --json FILE`", "invalid argument")
    return with_timeline


def _series(round_: dict, source: str):
    """(step end seconds, step ms, stall ms, [(layer, step, seconds)]) of a round, checked."""
    where = f"{source}: round {round_.get('round', '?')} serving_timeline"
    timeline = round_["serving_timeline"]
    try:
        values = [np.asarray(timeline[key], dtype=float) for key in SERIES]
        commits = [(int(c["layer"]), int(c["step"]), float(c["seconds"])) for c in timeline.get("commits", [])]
    except (KeyError, TypeError, ValueError) as failure:
        raise Error(f"{where}: malformed ({type(failure).__name__}: {failure})", "parse error") from None
    if any(v.ndim != 1 or len(v) != len(values[0]) for v in values) or not len(values[0]):
        raise Error(f"{where}: {', '.join(SERIES)} must be non-empty lists of one length, got lengths "
                    f"{[int(v.size) for v in values]}", "parse error")
    for layer, step, _ in commits:
        if not 0 <= step < len(values[0]):
            raise Error(f"{where}: layer {layer} commits at step {step}, outside the {len(values[0])} steps",
                        "parse error")
    return values[0], values[1] * 1e3, values[2] * 1e3, commits


def _panel_title(round_: dict) -> str:
    serving = round_.get("serving") or {}
    parts = [f"round {round_.get('round', '?')}"]
    if serving:
        parts.append(f"{serving.get('steps', '?')} steps, p50 {serving.get('step_seconds_p50', 0) * 1e3:.2f} ms, "
                     f"p99 {serving.get('step_seconds_p99', 0) * 1e3:.2f} ms, stall "
                     f"{serving.get('stall_seconds_total', 0) * 1e3:.1f} ms total / "
                     f"{serving.get('stall_seconds_max', 0) * 1e3:.2f} ms max, "
                     f"{serving.get('inconsistent_reads', '?')} inconsistent reads")
    return ": ".join(parts)


def _draw_round(axis, round_: dict, source: str, idle_p50_ms) -> None:
    ends, step_ms, stall_ms, commits = _series(round_, source)
    axis.plot(ends, step_ms, linewidth=0.8, color="tab:blue", label="serving step")
    axis.fill_between(ends, 0, stall_ms, step="pre", color="tab:red", alpha=0.5, label="stalled in eplb calls")
    if idle_p50_ms is not None:
        axis.axhline(idle_p50_ms, color="gray", linestyle="--", linewidth=0.8, label="idle p50 (no migration)")
    for number, (layer, step, _) in enumerate(commits):
        axis.axvline(ends[step], color="tab:green", alpha=0.35, linewidth=0.8,
                     label="layer commit" if number == 0 else None)
        axis.annotate(f"L{layer}", (ends[step], step_ms[step]), textcoords="offset points", xytext=(2, 4),
                      fontsize="x-small", color="tab:green")
    axis.set_ylabel("step time (ms)")
    axis.set_ylim(bottom=0)
    axis.grid(alpha=0.3)
    axis.set_title(_panel_title(round_), fontsize="small")
    axis.legend(loc="upper right", fontsize="x-small")


def timeline(report, *, round=None, title=None, out=None, max_input_bytes=None):  # noqa: A002  (the CLI's --round)
    """Serving step times over each round with the layer commits marked (see the module's docstring).

    Args:
        report: the path of an `eplb run --json` report, or its content as a dict.
        round: draw only this round (the report's "round" number, from 1); default every round
            that has a serving timeline.
        title: the figure's title (default: ranks, policy and commit mode from the report).
        out: write the picture there (.png, .svg, .pdf).
        max_input_bytes: the largest file read (default 1 GiB); only regular files are read.

    Returns:
        the matplotlib Figure.
    """
    from eplb.plot import _evaluate_results, _figure, save

    data = _evaluate_results(report, max_input_bytes)
    source = "report" if isinstance(report, dict) else str(report)
    rounds = _rounds_with_timeline(data, source, round)
    idle = data.get("serving_idle") or {}
    idle_p50_ms = idle["step_seconds_p50"] * 1e3 if "step_seconds_p50" in idle else None
    figure = _figure(11, 2.2 + 2.6 * len(rounds))
    axes = np.atleast_1d(figure.subplots(len(rounds), 1, squeeze=False)[:, 0])
    for axis, round_ in zip(axes, rounds):
        _draw_round(axis, round_, source, idle_p50_ms)
    axes[-1].set_xlabel("time in the round (s)")
    topology = data.get("topology", {})
    figure.suptitle(title or f"eplb run: serving steps while migrating ({topology.get('ranks', '?')} ranks, "
                             f"policy {data.get('policy', '?')}, commit {data.get('commit', 'copy')})")
    if out is not None:
        save(figure, out)
    return figure
