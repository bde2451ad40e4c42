// check_fingerprint, and the ProcessGroup base class: allgather, barrier and
// vote built on a group's one primitive, exchange(), the way a group
// implemented outside the library (a binding over torch.distributed) would
// provide it.
#include <gtest/gtest.h>

#include <thread>

#include "eplb/bootstrap.h"
#include "../../src/bootstrap/message.h"

namespace eplb {
namespace {

TEST(Fingerprint, NamesRankAndField) {
  auto groups = make_thread_groups(3);
  std::vector<Status> statuses(3);
  std::vector<std::thread> threads;
  for (int r = 0; r < 3; ++r)
    threads.emplace_back([&, r] {
      std::vector<FingerprintField> fields{{"topology", "L=8"}, {"policy", r == 2 ? "relabel" : "deepseek"}};
      statuses[r] = check_fingerprint(*groups[r], fields, Deadline::after_seconds(10));
    });
  for (auto& thread : threads) thread.join();
  for (const auto& status : statuses) {
    ASSERT_FALSE(status);
    EXPECT_EQ(status.code(), Code::Mismatch);
    EXPECT_NE(status.message().find("rank 2 has policy = 'relabel', rank 0 has 'deepseek'"), std::string::npos)
        << status.message();
  }
}

TEST(Fingerprint, AgreeingRanksPass) {
  auto groups = make_thread_groups(2);
  std::vector<Status> statuses(2);
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r)
    threads.emplace_back([&, r] {
      statuses[r] = check_fingerprint(*groups[r], {{"a", "1"}, {"b", std::string(300, 'x')}},
                                      Deadline::after_seconds(10));
    });
  for (auto& thread : threads) thread.join();
  for (const auto& status : statuses) EXPECT_TRUE(status) << status.to_string();
}

// A group of `size` ranks seen from rank 0 whose exchange() returns canned
// contributions from the other ranks: all a subclass has to provide.
class CannedGroup final : public ProcessGroup {
 public:
  explicit CannedGroup(std::vector<std::string> others) : others_(std::move(others)) {}
  int rank() const override { return 0; }
  int size() const override { return int(others_.size()) + 1; }
  std::string backend_name() const override { return "canned"; }
  Result<std::vector<std::string>> exchange(Collective kind, std::string mine, Deadline) override {
    kinds.push_back(kind);
    std::vector<std::string> all{std::move(mine)};
    all.insert(all.end(), others_.begin(), others_.end());
    return all;
  }
  std::vector<Collective> kinds;

 private:
  std::vector<std::string> others_;
};

TEST(ProcessGroupBase, CollectivesAreBuiltOnExchange) {
  const Deadline deadline = Deadline::after_seconds(1);
  CannedGroup yes({bootstrap::encode_vote(true, ""), bootstrap::encode_vote(true, "")});
  auto all_yes = yes.vote(true, "", deadline);
  ASSERT_TRUE(all_yes) << all_yes.status().to_string();
  EXPECT_TRUE(*all_yes);
  EXPECT_TRUE(yes.barrier(deadline));
  auto gathered = yes.allgather("mine", deadline);
  ASSERT_TRUE(gathered);
  EXPECT_EQ((*gathered)[0], "mine");
  EXPECT_EQ(yes.kinds, (std::vector<Collective>{Collective::Vote, Collective::Barrier, Collective::Allgather}));
  EXPECT_EQ(collective_name(Collective::Vote), "vote");

  CannedGroup no({bootstrap::encode_vote(true, ""), bootstrap::encode_vote(false, "checksum mismatch")});
  std::vector<std::string> reasons;
  auto vote = no.vote(true, "", deadline, &reasons);
  ASSERT_TRUE(vote);
  EXPECT_FALSE(*vote);
  EXPECT_EQ(reasons, (std::vector<std::string>{"", "", "checksum mismatch"}));

  CannedGroup garbled({bootstrap::encode_vote(true, ""), std::string("\x07", 1)});
  auto refused = garbled.vote(true, "", deadline);
  ASSERT_FALSE(refused);
  EXPECT_NE(refused.status().message().find("vote of rank 2"), std::string::npos) << refused.status().to_string();
}

}  // namespace
}  // namespace eplb
