// ReadRunList: the inline-first list of runs in a ReadRequest.
#include <gtest/gtest.h>

#include <utility>
#include <vector>

#include "eplb/plan.h"

namespace eplb {
namespace {

std::vector<int> sources(const ReadRunList& list) {
  std::vector<int> out;
  for (const ReadRun& run : list) out.push_back(run.source_slot);
  return out;
}

TEST(ReadRunList, BehavesLikeAVectorAcrossTheInlineLimit) {
  ReadRunList list;
  EXPECT_TRUE(list.empty());
  EXPECT_EQ(list.begin(), list.end());
  for (int i = 0; i < 7; ++i) {
    list.push_back({i, 10 + i, 1});
    ASSERT_EQ(list.size(), size_t(i + 1));
    EXPECT_EQ(list.back().source_slot, i);
    EXPECT_EQ(list.front().source_slot, 0);
    for (int j = 0; j <= i; ++j) EXPECT_EQ(list[size_t(j)].dest_slot, 10 + j);
  }
  list.back().count = 5;
  EXPECT_EQ(list[6].count, 5);
  list.clear();
  EXPECT_TRUE(list.empty());
  list.push_back({3, 4, 1});
  EXPECT_EQ(sources(list), std::vector<int>{3});
}

TEST(ReadRunList, ReserveKeepsContentAndCopiesAreIndependent) {
  ReadRunList list{{1, 2, 1}};
  list.reserve(1);
  list.reserve(10);
  EXPECT_EQ(sources(list), std::vector<int>{1});
  list.push_back({2, 3, 1});
  list.push_back({3, 4, 1});
  EXPECT_EQ(sources(list), (std::vector<int>{1, 2, 3}));

  for (ReadRunList original : {ReadRunList{{7, 0, 1}}, ReadRunList{{7, 0, 1}, {8, 1, 1}, {9, 2, 1}}}) {
    const std::vector<int> want = sources(original);
    ReadRunList copy = original;
    copy[0].source_slot = 99;
    EXPECT_EQ(sources(original), want);
    ReadRunList moved = std::move(copy);
    EXPECT_EQ(moved[0].source_slot, 99);
    EXPECT_EQ(moved.size(), want.size());
    ReadRunList assigned;
    assigned = moved;
    EXPECT_EQ(sources(assigned), sources(moved));
  }
}

TEST(ReadRunList, RequestSlotsCountsEveryRow) {
  ReadRequest request;
  EXPECT_EQ(request.slots(), 0);
  request.runs = {{0, 4, 2}, {5, 8, 1}, {9, 10, 3}};
  EXPECT_EQ(request.slots(), 6);
}

}  // namespace
}  // namespace eplb
