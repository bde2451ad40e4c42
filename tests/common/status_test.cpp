#include <gtest/gtest.h>

#include <climits>
#include <limits>

#include <atomic>
#include <thread>

#include "eplb/common.h"
#include "eplb/status.h"

namespace eplb {
namespace {

Result<int> parse_positive(int value) {
  if (value <= 0) return error(Code::InvalidArgument, "value " + std::to_string(value) + " is not positive");
  return value;
}

Result<int> doubled(int value) {
  EPLB_ASSIGN_OR_RETURN(int checked, parse_positive(value));
  return checked * 2;
}

Status check_both(int a, int b) {
  EPLB_TRY(parse_positive(a).status());
  EPLB_TRY(parse_positive(b).status().with_context("second"));
  return Status::ok();
}

TEST(Status, OkAndErrorCarryCodeAndMessage) {
  EXPECT_TRUE(Status::ok().is_ok());
  Status failure = error(Code::Timeout, "READ of 2 descriptors");
  EXPECT_FALSE(failure.is_ok());
  EXPECT_EQ(failure.code(), Code::Timeout);
  EXPECT_EQ(failure.to_string(), "timeout: READ of 2 descriptors");
  EXPECT_EQ(failure.with_context("layer 3").message(), "layer 3: READ of 2 descriptors");
  EXPECT_TRUE(Status::ok().with_context("ignored").is_ok());
}

TEST(Result, PropagatesThroughMacros) {
  EXPECT_EQ(doubled(4).value(), 8);
  auto failed = doubled(-1);
  ASSERT_FALSE(failed.is_ok());
  EXPECT_EQ(failed.status().code(), Code::InvalidArgument);
  EXPECT_EQ(check_both(1, -2).message(), "second: value -2 is not positive");
  EXPECT_TRUE(check_both(1, 2).is_ok());
}

TEST(ResultDeathTest, ValueOfAnErrorStopsWithItsMessage) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  Result<int> failed = error(Code::Timeout, "layer 3: no answer from rank 2");
  EXPECT_DEATH((void)failed.value(), "Result::value\\(\\) on an error: timeout: layer 3: no answer from rank 2");
  EXPECT_DEATH((void)*failed, "Result::value\\(\\) on an error");
}

TEST(Result, OkStatusWithoutValueIsAnInternalError) {
  Result<int> broken{Status::ok()};
  EXPECT_FALSE(broken.is_ok());
  EXPECT_EQ(broken.status().code(), Code::Internal);
}

TEST(Common, FormatsBytesAndSeconds) {
  EXPECT_EQ(format_bytes(12), "12 B");
  EXPECT_EQ(format_bytes(1536), "1.5 KiB");
  EXPECT_EQ(format_bytes(396ull << 20), "396 MiB");
  EXPECT_EQ(format_seconds(1.84), "1.8 s");
  EXPECT_EQ(format_seconds(0.25), "250 ms");
  EXPECT_EQ(format_seconds(12e-6), "12 us");
}

TEST(Common, DeadlineExpires) {
  // Far enough ahead that no scheduling delay on a loaded machine makes it
  // pass before the first checks.
  auto later = Deadline::after(std::chrono::hours(1));
  EXPECT_FALSE(later.expired());
  EXPECT_GT(later.remaining(), std::chrono::minutes(59));
  auto deadline = Deadline::after(std::chrono::milliseconds(5));
  std::this_thread::sleep_until(deadline.at() + std::chrono::milliseconds(1));
  EXPECT_TRUE(deadline.expired());
  EXPECT_EQ(deadline.remaining().count(), 0);
  EXPECT_TRUE(Deadline(Clock::now()).expired());
}

// Issue 17 row 8: 1e10 s used to overflow int64 nanoseconds into a deadline
// in the past (ranks killed after 11 ms). Deadlines saturate instead.
TEST(Common, DeadlinesSaturate) {
  const double one_year = 365.0 * 86400;
  for (double huge : {1e10, 1e300, std::numeric_limits<double>::infinity(), double(INT64_MAX)}) {
    Deadline never = Deadline::after_seconds(huge);
    EXPECT_FALSE(never.expired()) << huge;
    EXPECT_GT(never.remaining_seconds(), one_year) << huge;
  }
  EXPECT_EQ(Deadline::after_seconds(std::numeric_limits<double>::infinity()).at(), Clock::time_point::max());
  EXPECT_EQ(Deadline::after(std::chrono::nanoseconds::max()).at(), Clock::time_point::max());
  for (double none : {0.0, -1.0, -1e300, std::numeric_limits<double>::quiet_NaN()}) {
    EXPECT_TRUE(Deadline::after_seconds(none).expired()) << none;
    EXPECT_EQ(Deadline::after_seconds(none).remaining().count(), 0) << none;
  }
  EXPECT_TRUE(Deadline::after(std::chrono::nanoseconds::min()).expired());
  Deadline day = Deadline::after_seconds(86400);
  EXPECT_GT(day.remaining_seconds(), 86399.0);
  EXPECT_LE(day.remaining_seconds(), 86400.0);
}

TEST(Common, ParallelForVisitsEveryIndexOnce) {
  for (int threads : {1, 2, 4}) {
    std::vector<std::atomic<int>> visits(1000);
    parallel_for(visits.size(), threads, [&](size_t i) { visits[i]++; });
    for (auto& v : visits) EXPECT_EQ(v.load(), 1);
  }
  parallel_for(0, 4, [](size_t) { FAIL(); });
}

}  // namespace
}  // namespace eplb
