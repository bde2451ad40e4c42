// The failure path of `eplb run --async`'s serving loop, in process: four
// thread ranks over the loopback backend, one of which loses its serving
// group in the middle of a round. That rank aborts the round and drains
// (keeps calling commit_ready until its progress thread is done); the
// others see it stop answering at the serving step deadline (--timeout +
// 5 s) and drain too. Every rank must stop, with the abort and the serving
// loop's reason named, on the same committed layers, every slot verified
// and no inconsistent read. Label `concurrent` (TSan): two threads a rank.
#include <gtest/gtest.h>

#include <chrono>
#include <string>
#include <thread>

#include "eplb/app.h"

namespace eplb {
namespace {

// The serving group of a rank that loses it at its collective number
// `fail_at` (0-based): from then on every collective fails at once without
// reaching the other ranks, which wait for it until their deadline.
class LosingServingGroup : public ProcessGroup {
 public:
  LosingServingGroup(ProcessGroup& inner, int fail_at) : inner_(inner), fail_at_(fail_at) {}
  int rank() const override { return inner_.rank(); }
  int size() const override { return inner_.size(); }
  std::string backend_name() const override { return inner_.backend_name(); }
  Result<std::vector<std::string>> exchange(Collective kind, std::string mine, Deadline deadline) override {
    if (calls_++ >= fail_at_)
      return error(Code::RemoteDisconnect, "injected: the serving group's connection is gone");
    return inner_.exchange(kind, std::move(mine), deadline);
  }

 private:
  ProcessGroup& inner_;
  int fail_at_;
  int calls_ = 0;
};

bool contains(const std::string& text, const std::string& what) { return text.find(what) != std::string::npos; }

RunOptions drain_options() {
  RunOptions options;
  options.topology = Topology{3, 16, 24, 4, 2, 4};
  options.tensors = default_tensors(16 << 10);
  options.rounds = 2;
  options.window = 10;
  options.agent.backend = "loopback";
  options.agent_name_prefix = "serving-drain-test-";
  options.migrate.timeout_seconds = 1;  // a serving step waits 1 + 5 s
  options.migrate.retries = 0;
  options.serving.async = true;
  options.serving.step_ms = 1;
  options.serving.slot_share = 0.5;
  options.serving.idle_steps = 5;
  return options;
}

TEST(ServingDrain, ARankThatLosesItsServingGroupStopsEveryRankConsistently) {
  const RunOptions options = drain_options();
  const int ranks = options.topology.num_ranks, losing = 1;
  // Rank 1 loses its serving group at round 1's serving step 3: a layer of
  // three cannot have committed on every rank by then (two lead steps each).
  const int fail_at = options.serving.idle_steps + 3;
  auto groups = make_thread_groups(ranks);
  auto serving_groups = make_thread_groups(ranks);
  LosingServingGroup lost(*serving_groups[losing], fail_at);
  std::vector<RunSummary> summaries(ranks);
  std::vector<std::vector<RoundSummary>> rounds(ranks);
  const auto start = std::chrono::steady_clock::now();
  std::vector<std::thread> threads;
  for (int r = 0; r < ranks; ++r)
    threads.emplace_back([&, r] {
      RunOptions mine = options;
      mine.serving_group = r == losing ? &lost : serving_groups[r].get();
      mine.on_round_done = [&, r](const RoundSummary& round) { rounds[r].push_back(round); };
      summaries[r] = run_rank(*groups[r], mine);
    });
  for (auto& thread : threads) thread.join();
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  // The others wait 6 s for rank 1 at a step; far below the old 50 s wait.
  EXPECT_LT(seconds, 20.0);
  for (int r = 0; r < ranks; ++r) {
    const RunSummary& summary = summaries[r];
    SCOPED_TRACE("rank " + std::to_string(r) + ": " + summary.status.to_string());
    EXPECT_EQ(summary.status.code(), Code::Aborted);
    // Every rank whose serving failed asks to abort; the vote names the lowest.
    EXPECT_TRUE(contains(summary.status.message(), "asked to abort the round"));
    EXPECT_TRUE(contains(summary.status.message(), "this rank's serving loop: "));
    if (r == losing) {
      EXPECT_TRUE(contains(summary.status.message(), "injected: the serving group's connection is gone"));
    } else {
      EXPECT_TRUE(contains(summary.status.message(), "serving step"));
    }
    EXPECT_FALSE(summary.all_verified);
    EXPECT_TRUE(summary.group_intact);
    EXPECT_TRUE(contains(summary.final_state, "round 1 stopped"));
    EXPECT_TRUE(contains(summary.final_state, "slots verified byte for byte against that mapping"));
    EXPECT_EQ(summary.committed_layers, summaries[0].committed_layers);
    EXPECT_EQ(summary.mapping_hash, summaries[0].mapping_hash);
    ASSERT_EQ(rounds[r].size(), 1u);
    EXPECT_TRUE(rounds[r][0].served);
    EXPECT_GT(rounds[r][0].serving.steps, 0);
    EXPECT_EQ(rounds[r][0].serving.inconsistent_reads, 0);
  }
}

}  // namespace
}  // namespace eplb
