// The migration executor end to end in one process: ranks are threads
// (make_thread_groups), transfers go through the loopback xfer backend,
// optionally wrapped by the faulty backend. After every round every slot on
// every rank must hold its mapped expert byte for byte, and a failed layer
// must leave the old placement in place on every rank.
#include <xxhash.h>

#include <atomic>
#include <functional>
#include <map>
#include <gtest/gtest.h>
#include <random>
#include <thread>

#include "eplb/bootstrap.h"
#include "eplb/migrate.h"
#include "expert_content.h"

namespace eplb {
namespace {

std::atomic<int> agent_counter{0};

// A random valid placement: every expert once, the rest random replicas,
// shuffled over the slots.
Placement random_placement(const Topology& topology, std::mt19937_64& rng) {
  std::vector<int32_t> phy2log;
  for (int l = 0; l < topology.num_layers; ++l) {
    std::vector<int32_t> layer;
    for (int e = 0; e < topology.num_experts; ++e) layer.push_back(e);
    while (int(layer.size()) < topology.num_slots) layer.push_back(int32_t(rng() % topology.num_experts));
    std::shuffle(layer.begin(), layer.end(), rng);
    phy2log.insert(phy2log.end(), layer.begin(), layer.end());
  }
  return std::move(Placement::from_phy2log(topology.num_layers, topology.num_experts, topology.num_slots, phy2log))
      .value();
}

// Forwards to another group and counts the collectives by kind.
class CountingGroup final : public ProcessGroup {
 public:
  explicit CountingGroup(ProcessGroup& inner) : inner_(inner) {}
  int rank() const override { return inner_.rank(); }
  int size() const override { return inner_.size(); }
  std::string backend_name() const override { return inner_.backend_name(); }
  Result<std::vector<std::string>> exchange(Collective kind, std::string mine, Deadline deadline) override {
    ++counts[kind];
    return inner_.exchange(kind, std::move(mine), deadline);
  }
  std::map<Collective, int> counts;

 private:
  ProcessGroup& inner_;
};

struct RankResult {
  std::map<Collective, int> round_collectives;  // during migrate() only, summed over the rounds
  std::vector<RoundReport> rounds;
  Placement final_placement;
  Status verified;
  Status setup;
  Status checksums;  // every checksum the store remembers matches its live row
};

Status remembered_checksums_match(const ExpertStore& store) {
  for (int l = 0; l < store.layout().num_layers(); ++l)
    for (int s = 0; s < store.slots_per_rank(); ++s)
      for (int t = 0; t < int(store.layout().layers[l].size()); ++t) {
        auto cached = store.cached_checksum(l, s, t);
        if (!cached) continue;
        if (*cached != store.checksum(l, s, t))
          return error(Code::Mismatch, "layer " + std::to_string(l) + " local slot " + std::to_string(s) +
                                           " tensor " + std::to_string(t) + ": remembered checksum is stale");
      }
  return Status::ok();
}

// The rank and Migrator of the calling rank thread of run_rounds (for hooks).
thread_local int hook_rank = -1;
thread_local Migrator* hook_migrator = nullptr;

// Runs `targets` as consecutive rounds on `topology.num_ranks` threads.
std::vector<RankResult> run_rounds(const Topology& topology, const std::vector<TensorSpec>& tensors,
                                   const std::vector<Placement>& targets, const std::string& fault_spec = "",
                                   MigrateOptions options = {},
                                   std::function<void(int rank, Placement& current, Placement& target)>
                                       stale_view = {},
                                   std::function<void(int rank, MigrateOptions& options)> rank_options = {}) {
  auto thread_groups = make_thread_groups(topology.num_ranks);
  std::vector<std::unique_ptr<CountingGroup>> groups;
  for (auto& group : thread_groups) groups.push_back(std::make_unique<CountingGroup>(*group));
  std::vector<RankResult> results(size_t(topology.num_ranks));
  std::string prefix = "executor-test-" + std::to_string(agent_counter++) + "-";
  StoreLayout layout = StoreLayout::uniform(topology.num_layers, topology.slots_per_rank(), tensors);
  std::vector<std::thread> threads;
  for (int r = 0; r < topology.num_ranks; ++r)
    threads.emplace_back([&, r] {
      RankResult& result = results[size_t(r)];
      xfer::AgentConfig config;
      config.name = prefix + std::to_string(r);
      config.backend = "loopback";
      config.fault_spec = fault_spec;
      auto agent = xfer::Agent::create(config);
      auto store = ExpertStore::create_arena(layout, r * topology.slots_per_rank(), nullptr,
                                             options.commit == CommitMode::Swap);
      if (!agent || !store) {
        result.setup = !agent ? agent.status() : store.status();
        return;
      }
      Placement current = default_placement(topology);
      testing::fill_rows(**store, current);
      MigrateOptions mine = options;
      if (rank_options) rank_options(r, mine);
      auto migrator =
          Migrator::create(*groups[size_t(r)], **agent, **store, topology, mine, Deadline::after_seconds(20));
      if (!migrator) {
        result.setup = migrator.status();
        return;
      }
      groups[size_t(r)]->counts.clear();
      hook_rank = r;
      hook_migrator = migrator->get();
      for (Placement target : targets) {
        // What this rank believes is in force, and where it wants to go.
        if (stale_view) stale_view(r, current, target);
        RoundReport report = (*migrator)->migrate(current, target);
        bool ok = report.status.is_ok();
        result.rounds.push_back(std::move(report));
        if (!ok) break;
      }
      result.round_collectives = groups[size_t(r)]->counts;
      result.final_placement = current;
      result.verified = testing::verify_rows(**store, current);
      result.checksums = remembered_checksums_match(**store);
    });
  for (auto& thread : threads) thread.join();
  return results;
}

bool same_mapping(const Placement& a, const Placement& b) { return a.phy2log_data() == b.phy2log_data(); }

void expect_consistent(const std::vector<RankResult>& results) {
  for (size_t r = 0; r < results.size(); ++r) {
    ASSERT_TRUE(results[r].setup) << "rank " << r << ": " << results[r].setup.to_string();
    EXPECT_TRUE(results[r].verified) << "rank " << r << ": " << results[r].verified.to_string();
    EXPECT_TRUE(results[r].checksums) << "rank " << r << ": " << results[r].checksums.to_string();
    EXPECT_TRUE(results[r].final_placement == results[0].final_placement) << "rank " << r;
  }
}

class ExecutorRanks : public ::testing::TestWithParam<int> {};

TEST_P(ExecutorRanks, RandomPlacementsMoveByteForByte) {
  const int ranks = GetParam();
  Topology topology{4, 16, 24, 4, 2, ranks};
  std::mt19937_64 rng(ranks);
  std::vector<Placement> targets;
  for (int round = 0; round < 4; ++round) targets.push_back(random_placement(topology, rng));
  auto results = run_rounds(topology, testing::three_tensors(16 << 10), targets);
  expect_consistent(results);
  for (const auto& result : results) {
    ASSERT_EQ(result.rounds.size(), targets.size());
    for (const auto& round : result.rounds) {
      EXPECT_TRUE(round.status) << round.status.to_string();
      EXPECT_GT(round.bytes_moved(), 0u);
      EXPECT_EQ(round.retries(), 0);
      EXPECT_EQ(round.layers_committed(), topology.num_layers);
    }
  }
  EXPECT_TRUE(same_mapping(results[0].final_placement, targets.back()));
  // Remote reads happened within and across nodes.
  uint64_t intra = 0, inter = 0;
  for (const auto& round : results[0].rounds) intra += round.bytes_intra_node(), inter += round.bytes_inter_node();
  if (ranks > 2) {
    EXPECT_GT(intra, 0u);
  }
  EXPECT_GT(inter, 0u);
}

INSTANTIATE_TEST_SUITE_P(Ranks, ExecutorRanks, ::testing::Values(2, 4));

TEST(Executor, SwapsAndRotationsWithinAndAcrossRanks) {
  Topology topology{2, 4, 4, 1, 1, 2};
  // Layer 0: swap the two slots of rank 0 and the two of rank 1; layer 1: a
  // rotation across all slots.
  auto target = Placement::from_phy2log(2, 4, 4, {1, 0, 3, 2, 1, 2, 3, 0});
  ASSERT_TRUE(target);
  auto results = run_rounds(topology, {{"a", 1000}, {"b", 24}}, {*target});
  expect_consistent(results);
  EXPECT_TRUE(same_mapping(results[0].final_placement, *target));
  // Layer 0 entirely by local copies (4 slots), layer 1 half (2 slots).
  EXPECT_EQ(results[0].rounds[0].bytes_local(), 6u * 1024);
}

// Every kind of local copy: from a slot that keeps its expert (done at
// commit, live to live), from slots that change (a swap: through staging),
// and a second slot of an expert read in the same layer (copy after read).
TEST(Executor, LocalCopiesFromKeptChangingAndJustReadSlots) {
  Topology topology{1, 5, 8, 1, 1, 2};
  auto first = Placement::from_phy2log(1, 5, 8, {0, 1, 2, 3, 4, 0, 1, 2});
  // rank 0: slot 1 <- kept slot 0; slots 2 and 3 swap.
  // rank 1: slot 5 <- READ of expert 3 from rank 0, slot 6 <- copy of it;
  //         slot 7 <- expert 1 from slot 6, which changes.
  auto second = Placement::from_phy2log(1, 5, 8, {0, 0, 3, 2, 4, 3, 3, 1});
  ASSERT_TRUE(first && second);
  auto results = run_rounds(topology, {{"a", 3000}, {"b", 40}}, {*first, *second});
  expect_consistent(results);
  EXPECT_TRUE(same_mapping(results[0].final_placement, *second));
  const LayerReport& layer = results[0].rounds[1].layers[0];
  EXPECT_TRUE(layer.committed);
  EXPECT_EQ(layer.bytes_intra_node, 3040u);      // one READ (expert 3 to rank 1)
  EXPECT_EQ(layer.bytes_local, 5u * 3040u);      // slots 1, 2, 3, 6, 7
}

// The sync path with the swap commit: every kind of local copy lands in the
// spare buffer, rounds flip the buffers back and forth, checksums follow.
TEST(Executor, SwapCommitMovesByteForByteOverRounds) {
  Topology topology{1, 5, 8, 1, 1, 2};
  auto first = Placement::from_phy2log(1, 5, 8, {0, 1, 2, 3, 4, 0, 1, 2});
  auto second = Placement::from_phy2log(1, 5, 8, {0, 0, 3, 2, 4, 3, 3, 1});
  ASSERT_TRUE(first && second);
  MigrateOptions options;
  options.commit = CommitMode::Swap;
  auto results = run_rounds(topology, {{"a", 3000}, {"b", 40}}, {*first, *second, *first, *second}, "", options);
  expect_consistent(results);
  EXPECT_TRUE(same_mapping(results[0].final_placement, *second));
  for (const auto& result : results) {
    ASSERT_EQ(result.rounds.size(), 4u);
    for (const auto& round : result.rounds) EXPECT_TRUE(round.status) << round.status.to_string();
  }
  Topology wide{4, 16, 24, 4, 2, 4};
  std::mt19937_64 rng(7);
  std::vector<Placement> targets;
  for (int round = 0; round < 3; ++round) targets.push_back(random_placement(wide, rng));
  auto wide_results = run_rounds(wide, testing::three_tensors(16 << 10), targets, "corrupt=0.1,seed=5", options);
  expect_consistent(wide_results);
  EXPECT_TRUE(same_mapping(wide_results[0].final_placement, targets.back()));
}

TEST(Executor, NoChangeMovesNothing) {
  Topology topology{2, 8, 8, 1, 1, 2};
  auto results = run_rounds(topology, {{"w", 512}}, {default_placement(topology)});
  expect_consistent(results);
  EXPECT_EQ(results[0].rounds[0].bytes_moved(), 0u);
  for (const auto& layer : results[0].rounds[0].layers) EXPECT_FALSE(layer.changed);
}

TEST(Executor, OneChecksumAllgatherPerRoundAndOneVotePerChangedLayer) {
  // A round publishes the checksums of all its changed layers in one
  // allgather, then votes once per changed layer (no retries here); an
  // unchanged layer runs no collective. 5 layers, layer 2 unchanged.
  Topology topology{5, 16, 24, 4, 2, 4};
  std::mt19937_64 rng(5);
  Placement target = random_placement(topology, rng);
  ASSERT_TRUE(target.set_layer(2, default_placement(topology), 2));
  for (CommitMode commit : {CommitMode::Copy, CommitMode::Swap}) {
    MigrateOptions options;
    options.commit = commit;
    auto results = run_rounds(topology, {{"w", 256}, {"b", 64}}, {target}, "", options);
    expect_consistent(results);
    for (const auto& result : results) {
      ASSERT_EQ(result.rounds.size(), 1u);
      int changed = 0;
      for (const auto& layer : result.rounds[0].layers) changed += layer.changed ? 1 : 0;
      EXPECT_EQ(changed, 4);
      EXPECT_EQ(result.round_collectives.size(), 2u);
      EXPECT_EQ(result.round_collectives.at(Collective::Allgather), 1);
      EXPECT_EQ(result.round_collectives.at(Collective::Vote), changed);
    }
  }
}

// Issue 29, item 1: a rank with a stale view of the placement in force
// (slots 0 and 1 swapped). Before, the per-row checksums passed (a source
// hashes the row it holds, not the expert the reader expects) and two slots
// ended up holding the wrong experts. Now the round's first collective
// compares every rank's placements and every rank stops, naming the rank,
// layer and slot, with nothing moved.
TEST(Executor, RanksThatDisagreeAboutThePlacementStopBeforeAnythingMoves) {
  Topology topology{2, 4, 4, 1, 1, 2};
  auto target = Placement::from_phy2log(2, 4, 4, {2, 3, 0, 1, 1, 0, 3, 2});
  ASSERT_TRUE(target);
  auto swapped = [](const Placement& placement) {
    std::vector<int32_t> rows = placement.phy2log_data();
    std::swap(rows[0], rows[1]);
    return std::move(Placement::from_phy2log(2, 4, 4, rows)).value();
  };
  for (const char* which : {"old", "new"}) {
    const bool stale_old = std::string(which) == "old";
    auto stale = [&](int rank, Placement& current, Placement& wanted) {
      if (rank != 1) return;
      if (stale_old) current = swapped(current);
      else wanted = swapped(wanted);
    };
    auto results = run_rounds(topology, {{"w", 256}}, {*target}, "", {}, stale);
    const std::string expected = stale_old ? "rank 1 has expert 1 in layer 0 slot 0, rank 0 has expert 0"
                                           : "rank 1 has expert 3 in layer 0 slot 0, rank 0 has expert 2";
    for (size_t r = 0; r < results.size(); ++r) {
      ASSERT_TRUE(results[r].setup) << results[r].setup.to_string();
      ASSERT_EQ(results[r].rounds.size(), 1u);
      const RoundReport& round = results[r].rounds[0];
      EXPECT_EQ(round.status.code(), Code::Mismatch) << "rank " << r << ": " << round.status.to_string();
      EXPECT_NE(round.status.message().find(expected), std::string::npos) << round.status.message();
      EXPECT_NE(round.status.message().find(std::string("the ") + which + " placement"), std::string::npos)
          << round.status.message();
      EXPECT_TRUE(round.layers.empty());  // nothing ran, nothing committed
      EXPECT_TRUE(results[r].verified) << "rank " << r << ": " << results[r].verified.to_string();
    }
  }
}

// ------------------------------------------------------------- faults ---

TEST(ExecutorFaults, TransferErrorsAreRetriedAndComplete) {
  Topology topology{4, 16, 24, 4, 2, 4};
  std::mt19937_64 rng(11);
  std::vector<Placement> targets{random_placement(topology, rng), random_placement(topology, rng)};
  MigrateOptions options;
  options.retries = 8;
  auto results = run_rounds(topology, testing::three_tensors(8192), targets, "err=0.15,seed=5", options);
  expect_consistent(results);
  EXPECT_TRUE(same_mapping(results[0].final_placement, targets.back()));
  int retries = 0;
  for (const auto& round : results[0].rounds) {
    EXPECT_TRUE(round.status) << round.status.to_string();
    retries += round.retries();
  }
  EXPECT_GT(retries, 0);
  bool named = false;
  for (const auto& round : results[0].rounds)
    for (const auto& layer : round.layers)
      if (layer.failure.find("injected backend error") != std::string::npos &&
          layer.failure.find("READ from rank") != std::string::npos)
        named = true;
  EXPECT_TRUE(named);
}

TEST(ExecutorFaults, CorruptionIsCaughtByChecksumsAndRetried) {
  Topology topology{4, 16, 24, 4, 2, 4};
  std::mt19937_64 rng(12);
  std::vector<Placement> targets{random_placement(topology, rng)};
  MigrateOptions options;
  options.retries = 8;
  auto results = run_rounds(topology, testing::three_tensors(8192), targets, "corrupt=0.3,seed=1", options);
  expect_consistent(results);
  EXPECT_TRUE(same_mapping(results[0].final_placement, targets.back()));
  bool caught = false;
  for (const auto& layer : results[0].rounds[0].layers) {
    if (layer.failure.find("checksum mismatch") != std::string::npos &&
        layer.failure.find("read from rank") != std::string::npos && layer.failure.find("tensor") != std::string::npos)
      caught = true;
  }
  EXPECT_TRUE(caught);
}

TEST(ExecutorFaults, StallsHitTheDeadlineAndAbortCleanly) {
  Topology topology{3, 8, 12, 2, 2, 2};
  std::mt19937_64 rng(13);
  std::vector<Placement> targets{random_placement(topology, rng)};
  MigrateOptions options;
  options.retries = 1;
  options.timeout_seconds = 0.2;
  Stopwatch clock;
  auto results = run_rounds(topology, {{"w", 4096}}, targets, "stall=1", options);
  EXPECT_LT(clock.seconds(), 10.0);
  expect_consistent(results);
  // Layer 0 needs remote reads (random placement), they all stall: the round
  // stops at the first changed layer, which keeps its old placement.
  Placement initial = default_placement(topology);
  for (const auto& result : results) {
    ASSERT_EQ(result.rounds.size(), 1u);
    const RoundReport& round = result.rounds[0];
    ASSERT_FALSE(round.status);
    EXPECT_EQ(round.status.code(), Code::Aborted);
    const std::string& text = round.status.message();
    EXPECT_NE(text.find("aborted after 2 attempt(s)"), std::string::npos) << text;
    EXPECT_NE(text.find("still in progress at the deadline"), std::string::npos) << text;
    EXPECT_NE(text.find("kept its old placement on every rank"), std::string::npos) << text;
    EXPECT_NE(text.find("experts"), std::string::npos) << text;
    int failed_layer = round.layers.back().layer;
    EXPECT_FALSE(round.layers.back().committed);
    EXPECT_EQ(round.layers.back().retries, 1);
    for (int l = 0; l < topology.num_layers; ++l) {
      auto got = result.final_placement.layer_phy2log(l);
      auto want = (l < failed_layer ? targets[0] : initial).layer_phy2log(l);
      EXPECT_TRUE(std::equal(got.begin(), got.end(), want.begin(), want.end())) << "layer " << l;
    }
  }
}

TEST(ExecutorFaults, DelayBelowTheDeadlineCompletesAboveAborts) {
  Topology topology{2, 8, 12, 2, 2, 2};
  std::mt19937_64 rng(14);
  std::vector<Placement> targets{random_placement(topology, rng)};
  MigrateOptions options;
  options.retries = 0;
  options.timeout_seconds = 1.0;
  auto slow = run_rounds(topology, {{"w", 2048}}, targets, "delay_ms=50", options);
  expect_consistent(slow);
  EXPECT_TRUE(slow[0].rounds[0].status) << slow[0].rounds[0].status.to_string();
  EXPECT_TRUE(same_mapping(slow[0].final_placement, targets[0]));
  options.timeout_seconds = 0.1;
  auto too_slow = run_rounds(topology, {{"w", 2048}}, targets, "delay_ms=1000", options);
  expect_consistent(too_slow);
  ASSERT_FALSE(too_slow[0].rounds[0].status);
  EXPECT_EQ(too_slow[0].rounds[0].status.code(), Code::Aborted);
  EXPECT_TRUE(same_mapping(too_slow[0].final_placement, default_placement(topology)));
}

TEST(ExecutorFaults, DisconnectedPeerStopsTheRoundWithCommittedLayersConsistent) {
  Topology topology{4, 8, 12, 2, 2, 2};
  std::mt19937_64 rng(15);
  std::vector<Placement> targets{random_placement(topology, rng)};
  MigrateOptions options;
  options.retries = 2;
  // Each rank posts about one request per layer: requests fail from the 3rd post on.
  auto results = run_rounds(topology, {{"w", 2048}}, targets, "disconnect_after=2", options);
  expect_consistent(results);
  const RoundReport& round = results[0].rounds[0];
  ASSERT_FALSE(round.status);
  EXPECT_NE(round.status.message().find("peer vanished"), std::string::npos) << round.status.message();
  EXPECT_GE(round.layers_committed(), 1);
  EXPECT_LT(round.layers_committed(), topology.num_layers);
}

TEST(ExecutorSetup, LayoutMismatchIsRefusedBeforeAnythingMoves) {
  Topology topology{2, 4, 4, 1, 1, 2};
  auto groups = make_thread_groups(2);
  std::vector<Status> statuses(2);
  std::vector<std::thread> threads;
  std::string prefix = "layout-test-" + std::to_string(agent_counter++) + "-";
  for (int r = 0; r < 2; ++r)
    threads.emplace_back([&, r] {
      xfer::AgentConfig config;
      config.name = prefix + std::to_string(r);
      config.backend = "loopback";
      auto agent = std::move(xfer::Agent::create(config)).value();
      auto layout = StoreLayout::uniform(2, 2, {{"gate_up", 4096}, {"down", r == 1 ? 2000u : 2048u}});
      auto store = std::move(ExpertStore::create_arena(layout, r * 2)).value();
      auto migrator = Migrator::create(*groups[r], *agent, *store, topology, {}, Deadline::after_seconds(10));
      statuses[r] = migrator.status();
    });
  for (auto& thread : threads) thread.join();
  for (const auto& status : statuses) {
    ASSERT_FALSE(status);
    EXPECT_EQ(status.code(), Code::Mismatch);
    EXPECT_NE(status.message().find("nbytes_per_expert mismatch: rank 1 has layer 0 tensor 'down' of 2000 B per "
                                    "expert, rank 0 has 2048 B"),
              std::string::npos)
        << status.message();
  }
}

// After a round the ranks compare their committed mappings and their own
// checks: the typed message names the rank that differs.
TEST(ExecutorAgreement, RanksCompareMappingsAndChecks) {
  auto agree = [](std::vector<RankOutcome> outcomes) {
    auto groups = make_thread_groups(int(outcomes.size()));
    std::vector<Result<RoundAgreement>> results(outcomes.size(), Status(Code::Internal, "not run"));
    std::vector<std::thread> threads;
    for (size_t r = 0; r < outcomes.size(); ++r)
      threads.emplace_back([&, r] { results[r] = agree_on_round(*groups[r], outcomes[r], Deadline::after_seconds(10)); });
    for (auto& thread : threads) thread.join();
    return results;
  };
  auto same = agree({{0.5, 7, ""}, {1.5, 7, ""}, {1.0, 7, ""}});
  for (const auto& result : same) {
    ASSERT_TRUE(result) << result.status().to_string();
    EXPECT_TRUE(result->agreed);
    EXPECT_EQ(result->slowest_seconds, 1.5);
  }
  auto differs = agree({{0.5, 7, ""}, {0.5, 7, ""}, {0.5, 9, ""}});
  ASSERT_TRUE(differs[0]);
  EXPECT_FALSE(differs[0]->agreed);
  EXPECT_NE(differs[0]->failure.find("rank 2 committed a different mapping (0000000000000009) than rank 0"),
            std::string::npos)
      << differs[0]->failure;
  auto failed = agree({{0.5, 7, ""}, {0.5, 7, "mismatch: slot 3"}});
  ASSERT_TRUE(failed[1]);
  EXPECT_FALSE(failed[1]->agreed);
  EXPECT_EQ(failed[1]->failure, "rank 1: mismatch: slot 3");
}

TEST(ExecutorAgreement, MappingHashIsTheXxh3OfPhy2log) {
  Placement placement = default_placement(Topology{2, 4, 6, 1, 1, 2});
  const auto& phy2log = placement.phy2log_data();
  EXPECT_EQ(mapping_hash(placement), XXH3_64bits(phy2log.data(), phy2log.size() * sizeof(int32_t)));
}

}  // namespace
}  // namespace eplb

namespace eplb {
namespace {

// [issue 31] With the transfer schedule on, each layer's READs are posted
// round by round: the same rounds land byte for byte, with copy and swap
// commits, for rank-level and host-level schedules, and injected transfer
// errors are retried like any other (every rank draws the same fault
// sequence: a seed whose first posts fault).
TEST(Executor, TransferScheduleRoundsMoveByteForByte) {
  Topology topology{3, 16, 32, 4, 4, 8};  // 4 hosts of 2 ranks, 4 slots per rank
  std::mt19937_64 rng(31);
  std::vector<Placement> targets;
  for (int round = 0; round < 3; ++round) targets.push_back(random_placement(topology, rng));
  for (LinkBandwidths links : {LinkBandwidths{1, 1, 0}, LinkBandwidths{1, 1, 1}}) {
    for (CommitMode commit : {CommitMode::Copy, CommitMode::Swap}) {
      SCOPED_TRACE(std::string(links.host > 0 ? "hosts" : "ranks") + (commit == CommitMode::Swap ? " swap" : " copy"));
      MigrateOptions options;
      options.transfer_schedule = links;
      options.commit = commit;
      auto results = run_rounds(topology, testing::three_tensors(8 << 10), targets, "", options);
      expect_consistent(results);
      for (const auto& result : results) {
        ASSERT_EQ(result.rounds.size(), targets.size());
        for (const auto& round : result.rounds) EXPECT_TRUE(round.status) << round.status.to_string();
      }
      EXPECT_TRUE(same_mapping(results[0].final_placement, targets.back()));
    }
  }
  MigrateOptions faulty;
  faulty.transfer_schedule = LinkBandwidths{1, 1, 1};
  faulty.retries = 20;
  int retried = 0;
  for (int seed = 1; seed <= 6; ++seed) {
    SCOPED_TRACE("fault seed " + std::to_string(seed));
    auto results = run_rounds(topology, testing::three_tensors(8 << 10), targets,
                              "err=0.08,seed=" + std::to_string(seed), faulty);
    expect_consistent(results);
    bool completed = true;
    for (const auto& round : results[0].rounds) {
      retried += round.retries();
      completed = completed && round.status.is_ok();
    }
    if (completed && results[0].rounds.size() == targets.size()) {
      EXPECT_TRUE(same_mapping(results[0].final_placement, targets.back()));
    }
  }
  EXPECT_GT(retried, 0) << "no fault seed injected an error";
}

// [issue 31] The rounds of every layer's schedule when `targets` commit one
// after another from the default placement: the fences each rank joins.
int schedule_rounds(const Topology& topology, const std::vector<Placement>& targets, const LinkBandwidths& links) {
  int rounds = 0;
  Placement current = default_placement(topology);
  for (const Placement& target : targets) {
    for (int l = 0; l < topology.num_layers; ++l) {
      auto plan = plan_layer(current.layer_phy2log(l), target.layer_phy2log(l), topology, l);
      EXPECT_TRUE(plan) << plan.status().to_string();
      auto schedule = schedule_transfers(*plan, topology, links, 1.0);
      EXPECT_TRUE(schedule) << schedule.status().to_string();
      rounds += int(schedule->rounds.size());
    }
    current = target;
  }
  return rounds;
}

// [issue 31] Fenced rounds (MigrateOptions::fence_schedule_rounds): the
// same rounds land byte for byte, every rank joins exactly one fence (an
// allgather) per round of every layer's schedule, and a READ that fails on
// one rank ends the attempt on every rank at that round's fence: the
// others' failure names the rank and the round, and the retry completes.
TEST(Executor, FencedScheduleRoundsMoveByteForByte) {
  Topology topology{3, 16, 32, 4, 4, 8};  // 4 hosts of 2 ranks, 4 slots per rank
  std::mt19937_64 rng(31);
  std::vector<Placement> targets;
  for (int round = 0; round < 3; ++round) targets.push_back(random_placement(topology, rng));
  const LinkBandwidths hosts{1, 1, 1};
  for (CommitMode commit : {CommitMode::Copy, CommitMode::Swap}) {
    SCOPED_TRACE(commit == CommitMode::Swap ? "swap" : "copy");
    MigrateOptions options;
    options.transfer_schedule = hosts;
    options.commit = commit;
    auto free_rounds = run_rounds(topology, testing::three_tensors(8 << 10), targets, "", options);
    options.fence_schedule_rounds = true;
    auto fenced = run_rounds(topology, testing::three_tensors(8 << 10), targets, "", options);
    expect_consistent(fenced);
    for (const auto& result : fenced)
      for (const auto& round : result.rounds) EXPECT_TRUE(round.status) << round.status.to_string();
    EXPECT_TRUE(same_mapping(fenced[0].final_placement, targets.back()));
    const int fences = fenced[0].round_collectives.at(Collective::Allgather) -
                       free_rounds[0].round_collectives.at(Collective::Allgather);
    EXPECT_EQ(fences, schedule_rounds(topology, targets, hosts)) << "one fence per round of every layer";
    EXPECT_GT(fences, int(targets.size()) * topology.num_layers);
    EXPECT_EQ(fenced[0].round_collectives.at(Collective::Vote), free_rounds[0].round_collectives.at(Collective::Vote));
    for (const auto& result : fenced)
      EXPECT_EQ(result.round_collectives, fenced[0].round_collectives) << "every rank joins every fence";
  }
  MigrateOptions faulty;
  faulty.transfer_schedule = hosts;
  faulty.fence_schedule_rounds = true;
  faulty.retries = 20;
  int told_at_fence = 0;
  for (int seed = 1; seed <= 4; ++seed) {
    SCOPED_TRACE("fault seed " + std::to_string(seed));
    auto results = run_rounds(topology, testing::three_tensors(8 << 10), targets,
                              "err=0.01,seed=" + std::to_string(seed), faulty);
    expect_consistent(results);
    for (const auto& result : results) {
      ASSERT_EQ(result.rounds.size(), targets.size());
      EXPECT_EQ(result.round_collectives, results[0].round_collectives) << "every rank joins every fence";
      for (const auto& round : result.rounds) {
        EXPECT_TRUE(round.status) << round.status.to_string();
        for (const auto& layer : round.layers)
          told_at_fence += layer.failure.find("of layer " + std::to_string(layer.layer) + "'s transfer schedule") !=
                           std::string::npos;
      }
    }
    EXPECT_TRUE(same_mapping(results[0].final_placement, targets.back()));
  }
  EXPECT_GT(told_at_fence, 0) << "no rank learned of another's failed round at a fence";
}

// [issue 31] A stalled READ runs to the transfer deadline; the fence after
// it waits a collective's deadline, so the others meet the stalled rank
// there, the attempt is voted down and retried (as without fences), and
// every round completes. (The in-process groups here also passed with the
// transfer deadline as the fence's; over sockets that lost the round:
// RunCommand.FencedTransferScheduleVerifiesEveryRound shows it.)
TEST(Executor, FencedScheduleStallsAreRetried) {
  Topology topology{3, 16, 32, 4, 4, 8};
  std::mt19937_64 rng(5);
  std::vector<Placement> targets{random_placement(topology, rng)};
  MigrateOptions options;
  options.transfer_schedule = LinkBandwidths{1, 1, 1};
  options.fence_schedule_rounds = true;
  options.timeout_seconds = 0.3;
  options.collective_timeout_seconds = 5;
  options.retries = 20;
  Stopwatch clock;
  auto results = run_rounds(topology, testing::three_tensors(8 << 10), targets, "stall=0.2,seed=4", options);
  EXPECT_LT(clock.seconds(), 30.0);
  expect_consistent(results);
  int stalled = 0;
  std::string failures;
  for (const auto& result : results) {
    ASSERT_EQ(result.rounds.size(), 1u);
    EXPECT_TRUE(result.rounds[0].status) << result.rounds[0].status.to_string();
    for (const auto& layer : result.rounds[0].layers) {
      stalled += layer.failure.find("in progress at the deadline") != std::string::npos;
      failures += layer.failure + "\n";
    }
  }
  EXPECT_GT(stalled, 0) << "no READ stalled: the seed no longer injects a stall\n" << failures;
  EXPECT_TRUE(same_mapping(results[0].final_placement, targets.back()));
}

// [issue 31] A rank that stops before the first fence (a stop request, as a
// failed per-layer callback makes) still meets the others there: every
// rank ends the round at the next layer's first fence and vote, naming the
// rank that stopped it, in step (no collective meets another kind).
TEST(Executor, FencedScheduleRankStoppingBeforeTheFirstFence) {
  Topology topology{3, 16, 32, 4, 4, 8};
  std::mt19937_64 rng(7);
  const std::vector<Placement> targets{random_placement(topology, rng)};
  Placement layer_one_only = default_placement(topology);
  ASSERT_TRUE(layer_one_only.set_layer(1, targets[0], 1));
  ASSERT_GT(schedule_rounds(topology, {layer_one_only}, LinkBandwidths{1, 1, 1}), 0) << "layer 1 has fences";
  MigrateOptions options;
  options.transfer_schedule = LinkBandwidths{1, 1, 1};
  options.fence_schedule_rounds = true;
  options.on_layer_done = [](const LayerReport& layer) {
    if (hook_rank == 5 && layer.layer == 0)
      hook_migrator->stop_at_next_vote(error(Code::Aborted, "test stop on rank 5"));
  };
  auto results = run_rounds(topology, testing::three_tensors(8 << 10), targets, "", options);
  expect_consistent(results);
  for (size_t r = 0; r < results.size(); ++r) {
    ASSERT_EQ(results[r].rounds.size(), 1u);
    const Status& status = results[r].rounds[0].status;
    EXPECT_FALSE(status) << "rank " << r;
    EXPECT_NE(status.to_string().find("rank 5 stopped the round"), std::string::npos) << status.to_string();
    EXPECT_NE(status.to_string().find("test stop on rank 5"), std::string::npos) << status.to_string();
    EXPECT_EQ(results[r].round_collectives, results[0].round_collectives) << "rank " << r;
  }
}

// [issue 31] Ranks with different transfer schedules (a fenced one among
// them) are refused at set-up, naming the rank, before any collective of a
// round could meet another kind.
TEST(Executor, RanksWithDifferentTransferSchedulesAreRefused) {
  Topology topology{3, 16, 32, 4, 4, 8};
  MigrateOptions options;
  options.transfer_schedule = LinkBandwidths{1, 1, 1};
  auto results = run_rounds(topology, {{"w", 4096}}, {}, "", options, {}, [](int rank, MigrateOptions& mine) {
    if (rank == 3) mine.fence_schedule_rounds = true;
  });
  for (size_t r = 0; r < results.size(); ++r) {
    EXPECT_EQ(results[r].setup.code(), Code::Mismatch) << results[r].setup.to_string();
    EXPECT_NE(results[r].setup.message().find("rank 3 orders its READs with transfer schedule 'hosts-fenced', rank 0 "
                                              "with 'hosts'"),
              std::string::npos)
        << results[r].setup.to_string();
  }
}

// [issue 31] The one rule for the schedule's names (CLI and eplb.Migrator).
TEST(Executor, TransferScheduleNamesRoundTrip) {
  for (std::string name : {"off", "ranks", "hosts", "ranks-fenced", "hosts-fenced"}) {
    MigrateOptions options;
    ASSERT_TRUE(set_transfer_schedule(options, name)) << name;
    EXPECT_EQ(transfer_schedule_name(options), name);
    EXPECT_EQ(options.fence_schedule_rounds, name.ends_with("-fenced"));
    EXPECT_EQ(options.transfer_schedule.has_value(), name != "off");
  }
  for (std::string bad_name : {"nics", "off-fenced", "-fenced", "hosts-fenced-fenced", "Hosts"}) {
    MigrateOptions options;
    options.fence_schedule_rounds = true;
    const Status bad = set_transfer_schedule(options, bad_name);
    EXPECT_EQ(bad.code(), Code::InvalidArgument) << bad_name;
    EXPECT_EQ(bad.message(), "must be off, ranks, hosts, ranks-fenced or hosts-fenced, got '" + bad_name + "'");
    EXPECT_TRUE(options.fence_schedule_rounds && !options.transfer_schedule) << "unchanged after " << bad_name;
  }
  MigrateOptions custom;
  custom.transfer_schedule = LinkBandwidths{2, 1, 0};
  EXPECT_EQ(transfer_schedule_name(custom), "custom");
  custom.fence_schedule_rounds = true;
  EXPECT_EQ(transfer_schedule_name(custom), "custom-fenced");
}

}  // namespace
}  // namespace eplb
