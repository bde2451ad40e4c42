// run_report_tail_test.cpp - render_json_tail closes a streamed report: a run
// that ended names its mapping hash; one a launcher closes for a rank 0 gone
// early (RunSummary::interrupted) says "interrupted" and names no hash.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <string>

#include "eplb/app.h"

namespace eplb {
namespace {

nlohmann::json closed(const std::string& tail) {
  return nlohmann::json::parse("{\n  \"rounds\": [" + tail, nullptr, false);
}

TEST(RunReportTail, AnEndedRunNamesItsMappingHash) {
  RunSummary summary;
  summary.all_verified = true;
  summary.final_state = "done";
  summary.mapping_hash = 0xabc;
  const nlohmann::json json = closed(render_json_tail(summary));
  ASSERT_FALSE(json.is_discarded()) << render_json_tail(summary);
  EXPECT_EQ(json["status"], "ok");
  EXPECT_EQ(json["mapping_hash"], "0000000000000abc");
  EXPECT_FALSE(json.contains("interrupted"));
}

TEST(RunReportTail, AnInterruptedRunSaysSoAndNamesNoHash) {
  RunSummary summary;
  summary.interrupted = true;
  summary.status = error(Code::Canceled, "launch interrupted by signal 2 (SIGINT)");
  summary.final_state = "interrupted";
  const nlohmann::json json = closed(render_json_tail(summary));
  ASSERT_FALSE(json.is_discarded()) << render_json_tail(summary);
  EXPECT_EQ(json["interrupted"], true);
  EXPECT_EQ(json["all_verified"], false);
  EXPECT_EQ(json["status"], summary.status.to_string());
  EXPECT_FALSE(json.contains("mapping_hash"));
  EXPECT_TRUE(json["rounds"].empty());
}

}  // namespace
}  // namespace eplb
