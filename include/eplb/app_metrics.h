// eplb/app_metrics.h - `eplb run --metrics`: the run's counters, gauges and
// histograms in the Prometheus text exposition format (version 0.0.4), the
// format node_exporter's textfile collector reads. Part of the app module.
//
// Contract:
// - RunMetrics accumulates what an operator scrapes from the rounds of one
//   rank's reports: add_round() per round (as it ends), observe_stall() per
//   time the serving thread spent inside eplb calls (async runs only).
// - render() is a pure function of what was added: HELP and TYPE lines for
//   every metric, counters ending in _total, histograms with cumulative
//   buckets, _sum and _count; no timestamps (the textfile collector refuses
//   them). Every metric is present from the start, at zero (a labelled
//   failure counter has no sample until a layer fails).
// - Byte counters count the whole group (every RoundReport does); durations
//   are the observing rank's own per-layer times.
// - Writing the text to a file is the application's job (the CLI).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "eplb/status.h"

namespace eplb {

struct RoundSummary;

// A Prometheus histogram: `bounds` are the buckets' upper bounds
// (increasing; +Inf is implicit), counts[i] the observations in bucket i
// alone (counts.size() == bounds.size() + 1).
struct Histogram {
  explicit Histogram(std::vector<double> upper_bounds)
      : bounds(std::move(upper_bounds)), counts(bounds.size() + 1, 0) {}
  void observe(double value);
  std::vector<double> bounds;
  std::vector<uint64_t> counts;
  double sum = 0;
  uint64_t count = 0;
};

class RunMetrics {
 public:
  RunMetrics();
  // One migration round (completed or stopped) as this rank reported it.
  void add_round(const RoundSummary& round);
  // One stall of the serving thread (async runs), in seconds.
  void observe_stall(double seconds) { serving_stall_seconds_.observe(seconds); }
  // The exposition text (ends in a newline).
  std::string render() const;

  uint64_t rebalances() const { return rebalances_; }
  const Histogram& transfer_seconds() const { return transfer_seconds_; }

 private:
  uint64_t rebalances_ = 0;
  uint64_t bytes_local_ = 0, bytes_intra_node_ = 0, bytes_inter_node_ = 0;
  uint64_t layer_retries_ = 0;
  std::map<std::string, uint64_t> layer_failures_;  // by code label, e.g. "timeout"
  double balancedness_before_ = 0, balancedness_after_ = 0;
  Histogram layer_commit_seconds_;
  Histogram serving_stall_seconds_;
  Histogram transfer_seconds_;
};

// The `code` label of a failure code: its name in snake case
// ("remote_disconnect", "io_error").
std::string metric_code_label(Code code);

}  // namespace eplb
