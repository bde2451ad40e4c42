// run_metrics.cpp - RunMetrics (eplb/app_metrics.h): the run's metrics
// accumulated from round reports and rendered as Prometheus text.
#include <fmt/format.h>

#include <algorithm>
#include <cctype>

#include "eplb/app.h"
#include "eplb/app_metrics.h"

namespace eplb {
namespace {

// A layer's commit copies its changed rows (staging -> live): tens of
// microseconds for a small layer, seconds for a large one on a slow host.
const std::vector<double> kCommitBounds = {0.00001, 0.000025, 0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025,
                                           0.005,   0.01,     0.025,   0.05,   0.1,     0.25,   0.5,   1,      2.5};
// A serving step's stall inside eplb calls: microseconds when nothing is
// ready, a commit copy at most.
const std::vector<double> kStallBounds = {0.00001, 0.000025, 0.00005, 0.0001, 0.00025, 0.0005, 0.001,
                                          0.0025,  0.005,    0.01,    0.025,  0.05,    0.1,    0.25, 1};
// One layer's transfers (every read of the layer posted and landed).
const std::vector<double> kTransferBounds = {0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1,
                                             0.25,   0.5,   1,      2.5,   5,    10,    30};

std::string number(double value) { return fmt::format("{}", value); }

void header(std::string& out, const char* name, const char* type, const char* help) {
  out += fmt::format("# HELP {} {}\n# TYPE {} {}\n", name, help, name, type);
}

void render_histogram(std::string& out, const char* name, const char* help, const Histogram& histogram) {
  header(out, name, "histogram", help);
  uint64_t cumulative = 0;
  for (size_t i = 0; i < histogram.bounds.size(); ++i) {
    cumulative += histogram.counts[i];
    out += fmt::format("{}_bucket{{le=\"{}\"}} {}\n", name, number(histogram.bounds[i]), cumulative);
  }
  out += fmt::format("{}_bucket{{le=\"+Inf\"}} {}\n", name, histogram.count);
  out += fmt::format("{}_sum {}\n{}_count {}\n", name, number(histogram.sum), name, histogram.count);
}

void render_counters(std::string& out, uint64_t rebalances, uint64_t local, uint64_t intra, uint64_t inter,
                     uint64_t retries, const std::map<std::string, uint64_t>& failures) {
  header(out, "eplb_rebalances_total", "counter", "Migration rounds run (completed or stopped).");
  out += fmt::format("eplb_rebalances_total {}\n", rebalances);
  header(out, "eplb_bytes_moved_total", "counter",
         "Expert weight bytes moved by the whole group, by locality of the copy or read.");
  out += fmt::format("eplb_bytes_moved_total{{locality=\"local\"}} {}\n", local);
  out += fmt::format("eplb_bytes_moved_total{{locality=\"intra_node\"}} {}\n", intra);
  out += fmt::format("eplb_bytes_moved_total{{locality=\"inter_node\"}} {}\n", inter);
  header(out, "eplb_layer_retries_total", "counter", "Extra attempts of layers after a failed vote.");
  out += fmt::format("eplb_layer_retries_total {}\n", retries);
  header(out, "eplb_layer_failures_total", "counter",
         "Layers with at least one failed attempt (retried or not), by the code of the last failure.");
  for (const auto& [code, count] : failures) out += fmt::format("eplb_layer_failures_total{{code=\"{}\"}} {}\n", code, count);
}

}  // namespace

void Histogram::observe(double value) {
  const auto bucket = std::lower_bound(bounds.begin(), bounds.end(), value) - bounds.begin();
  ++counts[size_t(bucket)];
  sum += value;
  ++count;
}

std::string metric_code_label(Code code) {
  std::string label;
  for (char c : code_name(code)) {
    if (std::isalnum(static_cast<unsigned char>(c))) label += char(std::tolower(static_cast<unsigned char>(c)));
    else if (c == ' ') label += '_';
  }
  return label;
}

RunMetrics::RunMetrics()
    : layer_commit_seconds_(kCommitBounds), serving_stall_seconds_(kStallBounds), transfer_seconds_(kTransferBounds) {}

void RunMetrics::add_round(const RoundSummary& round) {
  const RoundReport& report = round.report;
  ++rebalances_;
  bytes_local_ += report.bytes_local();
  bytes_intra_node_ += report.bytes_intra_node();
  bytes_inter_node_ += report.bytes_inter_node();
  layer_retries_ += uint64_t(report.retries());
  balancedness_before_ = round.balancedness_before;
  balancedness_after_ = round.balancedness_after;
  for (const LayerReport& layer : report.layers) {
    if (!layer.failure.empty())
      ++layer_failures_[layer.failure_code == Code::Ok ? std::string("unknown") : metric_code_label(layer.failure_code)];
    if (!layer.changed) continue;
    transfer_seconds_.observe(layer.seconds_transfer);
    if (layer.committed) layer_commit_seconds_.observe(layer.seconds_commit);
  }
  // An --async round: one stall observation per serving step of this rank.
  if (round.served)
    for (double stall : round.timeline.stall_seconds) observe_stall(stall);
}

std::string RunMetrics::render() const {
  std::string out;
  render_counters(out, rebalances_, bytes_local_, bytes_intra_node_, bytes_inter_node_, layer_retries_,
                  layer_failures_);
  header(out, "eplb_balancedness", "gauge",
         "Mean over layers of mean rank load / max rank load (1 is perfect) in the last round's load window, "
         "on the placement before and after the round.");
  out += fmt::format("eplb_balancedness{{when=\"before\"}} {}\n", number(balancedness_before_));
  out += fmt::format("eplb_balancedness{{when=\"after\"}} {}\n", number(balancedness_after_));
  render_histogram(out, "eplb_layer_commit_seconds", "Time to commit one changed layer (staging to live rows).",
                   layer_commit_seconds_);
  render_histogram(out, "eplb_serving_stall_seconds",
                   "Time the serving thread spent inside eplb calls per serving step (async runs only).",
                   serving_stall_seconds_);
  render_histogram(out, "eplb_transfer_seconds",
                   "Time of one changed layer's transfers (all attempts), as the observing rank saw it.",
                   transfer_seconds_);
  return out;
}

}  // namespace eplb
