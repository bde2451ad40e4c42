"""eplb.metrics: the Prometheus metrics of `eplb run --metrics`, for a Migrator in a Python engine.

Contract:
- `collector(migrator, registry=prometheus_client.REGISTRY)` returns a MigratorCollector (a
  prometheus_client custom collector) registered with `registry` (None: not registered) and fed
  by every round of `migrator`: migrate() (completed or failed) and async rounds started with
  start() once they end, plus each commit_ready() call's time as a serving stall.
- A scrape yields the names `eplb run --metrics` writes (docs/operations.md), with HELP text:
  eplb_rebalances_total, eplb_bytes_moved_total{locality}, eplb_layer_retries_total,
  eplb_layer_failures_total{code}, eplb_balancedness{when}, and the histograms
  eplb_layer_commit_seconds, eplb_transfer_seconds, eplb_serving_stall_seconds (same buckets).
  Byte counters are the whole group's; durations this rank's own. eplb_balancedness has samples
  once set_balancedness() was called (the Migrator does not know the load).
- Thread-safe: rounds are observed on the serving thread, scrapes run on the exporter's thread.
"""
from __future__ import annotations

import bisect
import re
import threading

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily

__all__ = ["collector", "MigratorCollector", "COMMIT_BUCKETS", "STALL_BUCKETS", "TRANSFER_BUCKETS"]

COMMIT_BUCKETS = (0.00001, 0.000025, 0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05,
                  0.1, 0.25, 0.5, 1, 2.5)
STALL_BUCKETS = (0.00001, 0.000025, 0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05,
                 0.1, 0.25, 1)
TRANSFER_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)
LOCALITIES = ("local", "intra_node", "inter_node")


def code_label(code: str) -> str:
    """A failure code name as a label value: "remote disconnect" -> "remote_disconnect", "I/O error" -> "io_error"."""
    return re.sub(r"[^a-z0-9_]", "", code.lower().replace(" ", "_")) or "unknown"


class _Histogram:
    """Observations in fixed buckets (upper bounds inclusive, +Inf implicit)."""

    def __init__(self, bounds):
        self.bounds, self.counts, self.sum = tuple(bounds), [0] * (len(bounds) + 1), 0.0

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.bounds, value)] += 1
        self.sum += value

    def family(self, name: str, documentation: str) -> HistogramMetricFamily:
        cumulative, buckets = 0, []
        for bound, count in zip((*map(_le, self.bounds), "+Inf"), self.counts):
            cumulative += count
            buckets.append((bound, cumulative))
        return HistogramMetricFamily(name, documentation, buckets=buckets, sum_value=self.sum)


def _le(bound: float) -> str:
    return repr(float(bound)) if bound != int(bound) else f"{float(bound)}"


class MigratorCollector:
    """The metrics of one Migrator's rounds (see the module's docstring); made by eplb.metrics.collector."""

    def __init__(self):
        self._lock = threading.Lock()
        self._rebalances = 0
        self._bytes = dict.fromkeys(LOCALITIES, 0)
        self._retries = 0
        self._failures: dict[str, int] = {}
        self._balancedness: tuple[float, float] | None = None
        self._commit = _Histogram(COMMIT_BUCKETS)
        self._stall = _Histogram(STALL_BUCKETS)
        self._transfer = _Histogram(TRANSFER_BUCKETS)

    def observe_round(self, layer_reports) -> None:
        """One round's per-layer reports (the dicts of report["layers"]), completed or stopped."""
        with self._lock:
            self._rebalances += 1
            for layer in layer_reports:
                if layer["committed"]:
                    for locality in LOCALITIES:
                        self._bytes[locality] += layer[f"bytes_{locality}"]
                self._retries += layer["retries"]
                if layer["failure"]:
                    label = code_label(layer.get("failure_code") or "unknown")
                    self._failures[label] = self._failures.get(label, 0) + 1
                if layer["changed"]:
                    self._transfer.observe(layer["seconds_transfer"])
                    if layer["committed"]:
                        self._commit.observe(layer["seconds_commit"])

    def observe_stall(self, seconds: float) -> None:
        """Time the serving thread spent inside one eplb call of an async round."""
        with self._lock:
            self._stall.observe(seconds)

    def set_balancedness(self, before: float, after: float) -> None:
        """The last rebalance's balancedness (eplb.balancedness) on its load window, before and after."""
        with self._lock:
            self._balancedness = (float(before), float(after))

    def collect(self):
        """The metric families (prometheus_client's Collector protocol)."""
        with self._lock:
            yield CounterMetricFamily("eplb_rebalances", "Migration rounds run (completed or stopped).",
                                      value=self._rebalances)
            moved = CounterMetricFamily("eplb_bytes_moved", "Expert weight bytes moved by the whole group, by "
                                        "locality of the copy or read.", labels=["locality"])
            for locality in LOCALITIES:
                moved.add_metric([locality], self._bytes[locality])
            yield moved
            yield CounterMetricFamily("eplb_layer_retries", "Extra attempts of layers after a failed vote.",
                                      value=self._retries)
            failures = CounterMetricFamily("eplb_layer_failures", "Layers with at least one failed attempt "
                                           "(retried or not), by the code of the last failure.", labels=["code"])
            for code, count in sorted(self._failures.items()):
                failures.add_metric([code], count)
            yield failures
            balancedness = GaugeMetricFamily("eplb_balancedness", "Mean over layers of mean rank load / max rank "
                                             "load (1 is perfect), before and after the last rebalance.",
                                             labels=["when"])
            if self._balancedness is not None:
                balancedness.add_metric(["before"], self._balancedness[0])
                balancedness.add_metric(["after"], self._balancedness[1])
            yield balancedness
            yield self._commit.family("eplb_layer_commit_seconds",
                                      "Time to commit one changed layer (staging to live rows).")
            yield self._stall.family("eplb_serving_stall_seconds",
                                     "Time the serving thread spent inside eplb calls per serving step (async "
                                     "rounds only).")
            yield self._transfer.family("eplb_transfer_seconds",
                                        "Time of one changed layer's transfers (all attempts), as this rank saw it.")


def collector(migrator, registry="default") -> MigratorCollector:
    """Registers a MigratorCollector fed by `migrator`'s rounds with `registry` and returns it.

    Args:
        migrator: an eplb.Migrator.
        registry: a prometheus_client CollectorRegistry; the default is prometheus_client.REGISTRY;
            None leaves the collector unregistered.
    """
    from eplb.migrator import Migrator
    if not isinstance(migrator, Migrator):
        from eplb.errors import Error
        raise Error(f"collector() needs an eplb.Migrator, got {type(migrator).__name__}")
    if registry == "default":
        from prometheus_client import REGISTRY
        registry = REGISTRY
    made = MigratorCollector()
    migrator._observers.append(made)
    if registry is not None:
        registry.register(made)
    return made
