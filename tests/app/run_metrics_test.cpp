// RunMetrics (eplb/app_metrics.h): what `eplb run --metrics` renders from
// round reports, checked on hand-made reports (the file itself and a real
// parser: python/tests/test_run_metrics.py).
#include <gtest/gtest.h>

#include <string>

#include "eplb/app.h"
#include "eplb/app_metrics.h"

namespace eplb {
namespace {

LayerReport changed_layer(int layer, double transfer, double commit, bool committed) {
  LayerReport report;
  report.layer = layer;
  report.changed = true;
  report.committed = committed;
  report.bytes_local = 100;
  report.bytes_intra_node = committed ? 1000 : 0;
  report.bytes_inter_node = committed ? 10000 : 0;
  report.seconds_transfer = transfer;
  report.seconds_commit = commit;
  return report;
}

bool has_line(const std::string& text, const std::string& line) {
  return text.find("\n" + line + "\n") != std::string::npos || text.rfind(line + "\n", 0) == 0;
}

TEST(RunMetrics, EveryMetricIsPresentAtZeroBeforeAnyRound) {
  const std::string text = RunMetrics().render();
  for (const char* name : {"eplb_rebalances_total", "eplb_bytes_moved_total", "eplb_layer_retries_total",
                           "eplb_layer_failures_total", "eplb_balancedness", "eplb_layer_commit_seconds",
                           "eplb_serving_stall_seconds", "eplb_transfer_seconds"}) {
    EXPECT_NE(text.find(std::string("# HELP ") + name + " "), std::string::npos) << name;
    EXPECT_NE(text.find(std::string("# TYPE ") + name + " "), std::string::npos) << name;
  }
  EXPECT_TRUE(has_line(text, "eplb_rebalances_total 0"));
  EXPECT_TRUE(has_line(text, "eplb_serving_stall_seconds_count 0"));
  EXPECT_TRUE(has_line(text, "eplb_serving_stall_seconds_bucket{le=\"+Inf\"} 0"));
  EXPECT_EQ(text.find("eplb_layer_failures_total{"), std::string::npos) << "no failure sample before a failure";
  EXPECT_EQ(text.back(), '\n');
}

TEST(RunMetrics, RoundsAddUpCountersAndHistograms) {
  RoundSummary first;
  first.balancedness_before = 0.5;
  first.balancedness_after = 0.75;
  first.report.layers = {changed_layer(0, 0.003, 0.0002, true), changed_layer(1, 0.02, 0.004, true), LayerReport{}};
  first.report.layers[1].retries = 2;
  first.report.layers[1].failure = "attempt 1: timeout: ...";
  first.report.layers[1].failure_code = Code::Timeout;
  RoundSummary second;
  second.balancedness_before = 0.6;
  second.balancedness_after = 0.9;
  second.report.layers = {changed_layer(0, 0.5, 0, false)};
  second.report.layers[0].failure = "remote disconnect: rank 3";
  second.report.layers[0].failure_code = Code::RemoteDisconnect;
  RunMetrics metrics;
  metrics.add_round(first);
  metrics.add_round(second);
  metrics.observe_stall(0.00002);
  const std::string text = metrics.render();
  EXPECT_TRUE(has_line(text, "eplb_rebalances_total 2"));
  // RoundReport sums committed layers only.
  EXPECT_TRUE(has_line(text, "eplb_bytes_moved_total{locality=\"local\"} 200"));
  EXPECT_TRUE(has_line(text, "eplb_bytes_moved_total{locality=\"intra_node\"} 2000"));
  EXPECT_TRUE(has_line(text, "eplb_bytes_moved_total{locality=\"inter_node\"} 20000"));
  EXPECT_TRUE(has_line(text, "eplb_layer_retries_total 2"));
  EXPECT_TRUE(has_line(text, "eplb_layer_failures_total{code=\"timeout\"} 1"));
  EXPECT_TRUE(has_line(text, "eplb_layer_failures_total{code=\"remote_disconnect\"} 1"));
  EXPECT_TRUE(has_line(text, "eplb_balancedness{when=\"before\"} 0.6"));
  EXPECT_TRUE(has_line(text, "eplb_balancedness{when=\"after\"} 0.9"));
  // Two commits (0.2 ms, 4 ms), buckets cumulative.
  EXPECT_TRUE(has_line(text, "eplb_layer_commit_seconds_bucket{le=\"0.0001\"} 0"));
  EXPECT_TRUE(has_line(text, "eplb_layer_commit_seconds_bucket{le=\"0.00025\"} 1"));
  EXPECT_TRUE(has_line(text, "eplb_layer_commit_seconds_bucket{le=\"0.005\"} 2"));
  EXPECT_TRUE(has_line(text, "eplb_layer_commit_seconds_count 2"));
  // Three changed layers transferred, the uncommitted one included.
  EXPECT_TRUE(has_line(text, "eplb_transfer_seconds_count 3"));
  EXPECT_TRUE(has_line(text, "eplb_transfer_seconds_bucket{le=\"0.0025\"} 0"));
  EXPECT_TRUE(has_line(text, "eplb_transfer_seconds_bucket{le=\"0.005\"} 1"));
  EXPECT_TRUE(has_line(text, "eplb_transfer_seconds_bucket{le=\"0.5\"} 3"));
  EXPECT_TRUE(has_line(text, "eplb_serving_stall_seconds_count 1"));
  EXPECT_TRUE(has_line(text, "eplb_serving_stall_seconds_bucket{le=\"2.5e-05\"} 1"));
  EXPECT_TRUE(has_line(text, "eplb_serving_stall_seconds_bucket{le=\"1e-05\"} 0"));
}

TEST(RunMetrics, AValueOnABoundCountsInThatBucket) {
  Histogram histogram({1, 2});
  histogram.observe(1);
  histogram.observe(2.5);
  EXPECT_EQ(histogram.counts, (std::vector<uint64_t>{1, 0, 1}));
  EXPECT_EQ(histogram.count, 2u);
  EXPECT_DOUBLE_EQ(histogram.sum, 3.5);
}

TEST(RunMetrics, CodeLabelsAreSnakeCase) {
  EXPECT_EQ(metric_code_label(Code::RemoteDisconnect), "remote_disconnect");
  EXPECT_EQ(metric_code_label(Code::IoError), "io_error");
  EXPECT_EQ(metric_code_label(Code::Backend), "backend_error");
  EXPECT_EQ(metric_code_label(Code::Timeout), "timeout");
}

}  // namespace
}  // namespace eplb
