// The app's pieces that are not the command line: the simulated expert
// tensors, sim's bytes in an expert store, and run_rank as a library call
// (progress through callbacks, results as data).
#include <gtest/gtest.h>
#include <xxhash.h>

#include <cstring>
#include <thread>

#include "eplb/app.h"

namespace eplb {
namespace {

Topology small_topology() { return Topology{3, 8, 12, 2, 2, 4}; }

TEST(ExpertTensors, DefaultTensorsAddUpAndDiffer) {
  for (uint64_t bytes : {uint64_t(3072), uint64_t(4096), uint64_t(1) << 20, uint64_t(8) << 20, uint64_t(1000003)}) {
    auto tensors = default_tensors(bytes);
    ASSERT_EQ(tensors.size(), 3u) << bytes;
    EXPECT_EQ(tensors[0].name, "gate_up");
    EXPECT_EQ(tensors[1].name, "down");
    EXPECT_EQ(tensors[2].name, "scales");
    EXPECT_EQ(tensors[0].bytes_per_expert + tensors[1].bytes_per_expert + tensors[2].bytes_per_expert, bytes);
    EXPECT_GT(tensors[0].bytes_per_expert, tensors[1].bytes_per_expert);
    EXPECT_GT(tensors[1].bytes_per_expert, tensors[2].bytes_per_expert);
  }
  auto mib = default_tensors(1 << 20);
  EXPECT_EQ(mib[2].bytes_per_expert, 4096u);
  EXPECT_EQ(mib[1].bytes_per_expert, 348160u);
  EXPECT_EQ(mib[0].bytes_per_expert, 696320u);
  auto tiny = default_tensors(100);
  ASSERT_EQ(tiny.size(), 1u);
  EXPECT_EQ(tiny[0].bytes_per_expert, 100u);
}

TEST(ExpertTensors, ParsesTheTensorsSpec) {
  auto tensors = parse_tensors("gate_up:2MiB,down:1MiB,scales:8KiB");
  ASSERT_TRUE(tensors) << tensors.status().to_string();
  ASSERT_EQ(tensors->size(), 3u);
  EXPECT_EQ((*tensors)[1].name, "down");
  EXPECT_EQ((*tensors)[2].bytes_per_expert, 8192u);
  EXPECT_EQ((*parse_tensors("w:1.5M"))[0].bytes_per_expert, 1572864u);
  for (const char* bad : {"", "a", "a:", ":4", "a:4,,b:4", "a:4,a:8", "a b:4", "a:x"}) {
    auto refused = parse_tensors(bad);
    ASSERT_FALSE(refused) << bad;
    EXPECT_EQ(refused.status().code(), Code::InvalidArgument) << bad;
    EXPECT_EQ(refused.status().message().find("--"), std::string::npos) << "names a flag: " << refused.status().message();
  }
  EXPECT_EQ(parse_tensors("w:4,w:8").status().message(), "tensor 'w' is named twice");
  EXPECT_NE(parse_tensors("w:4X").status().message().find("tensor 'w': '4X' is not a byte size"), std::string::npos);
}

TEST(SimulatedRows, FillWritesSimBytesAndVerifyChecksThem) {
  Topology topology = small_topology();
  StoreLayout layout = StoreLayout::uniform(topology.num_layers, topology.slots_per_rank(), default_tensors(8192));
  Placement placement = default_placement(topology);
  for (int rank = 0; rank < topology.num_ranks; ++rank) {
    auto store_or = ExpertStore::create_arena(layout, rank * topology.slots_per_rank());
    ASSERT_TRUE(store_or) << store_or.status().to_string();
    auto& store = **store_or;
    (void)store.known_checksum(2, 1, 1);  // stale once the row is rewritten
    fill_simulated(store, placement);
    ASSERT_TRUE(store.cached_checksum(2, 1, 1));  // the new content's, recorded while filling
    Status verified = verify_simulated(store, placement);
    EXPECT_TRUE(verified) << verified.to_string();
    // The row holds exactly fill_expert_bytes of its expert.
    const int expert = placement.phy2log(2, rank * topology.slots_per_rank() + 1);
    std::vector<uint8_t> expected(store.row_bytes(2, 1));
    fill_expert_bytes(2, expert, 1, 0, expected);
    EXPECT_EQ(std::memcmp(store.row(2, 1, 1), expected.data(), expected.size()), 0);
    EXPECT_EQ(store.checksum(2, 1, 1), XXH3_64bits(expected.data(), expected.size()));
    EXPECT_EQ(*store.cached_checksum(2, 1, 1), XXH3_64bits(expected.data(), expected.size()));
  }
}

TEST(SimulatedRows, VerifyNamesTheSlotExpertTensorAndOffset) {
  Topology topology = small_topology();
  StoreLayout layout = StoreLayout::uniform(topology.num_layers, topology.slots_per_rank(), default_tensors(8192));
  Placement placement = default_placement(topology);
  auto store = std::move(ExpertStore::create_arena(layout, 3)).value();
  fill_simulated(*store, placement);
  store->row(1, 2, 0)[100] ^= 0x5a;
  Status status = verify_simulated(*store, placement);
  ASSERT_FALSE(status);
  EXPECT_NE(status.message().find("layer 1 slot 5 should hold expert " + std::to_string(placement.phy2log(1, 5))),
            std::string::npos)
      << status.message();
  EXPECT_NE(status.message().find("tensor 'gate_up' differs at byte 100"), std::string::npos) << status.message();
  // Swapping the content of two slots holding different experts is caught too.
  fill_simulated(*store, placement);
  std::vector<uint8_t> keep;
  for (int t = 0; t < 3; ++t) {
    keep.resize(store->row_bytes(0, t));
    std::memcpy(keep.data(), store->row(0, 0, t), keep.size());
    std::memcpy(store->row(0, 0, t), store->row(0, 1, t), keep.size());
    std::memcpy(store->row(0, 1, t), keep.data(), keep.size());
  }
  EXPECT_FALSE(verify_simulated(*store, placement));
}

// run_rank as a library call on thread ranks: progress arrives through the
// callbacks, the results are data, and the report renders from them.
TEST(RunRank, ReportsThroughCallbacksAndData) {
  RunOptions options;
  options.topology = Topology{2, 8, 12, 2, 2, 2};
  options.tensors = default_tensors(16 << 10);
  options.rounds = 2;
  options.window = 5;
  options.agent.backend = "loopback";
  options.agent_name_prefix = "run-rank-test-";
  std::vector<RunSummary> summaries(2);
  std::vector<int> layers_seen(2), rounds_seen(2), ready(2);
  auto groups = make_thread_groups(2);
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r)
    threads.emplace_back([&, r] {
      RunOptions mine = options;
      mine.migrate.on_layer_done = [&, r](const LayerReport&) { ++layers_seen[r]; };
      mine.on_round_done = [&, r](const RoundSummary&) { ++rounds_seen[r]; };
      mine.on_ready = [&, r](const RunSummary& summary) { ready[r] = !summary.trace_identity.empty(); };
      summaries[r] = run_rank(*groups[r], mine);
    });
  for (auto& thread : threads) thread.join();
  for (int r = 0; r < 2; ++r) {
    ASSERT_TRUE(summaries[r].status) << summaries[r].status.to_string();
    EXPECT_TRUE(summaries[r].all_verified);
    EXPECT_EQ(ready[r], 1);
    EXPECT_EQ(layers_seen[r], 4);
    EXPECT_EQ(rounds_seen[r], 2);
    EXPECT_EQ(summaries[r].transports, "loopback: in-process copies");
    EXPECT_EQ(summaries[r].mapping_hash, summaries[0].mapping_hash);
  }
  const std::string table = render_table(options, summaries[0]);
  EXPECT_NE(table.find("all 24 slots (2 layers x 12 slots) on 2 ranks verified byte for byte"), std::string::npos)
      << table;
  const std::string json = render_json(options, {"loopback", "threads"}, summaries[0]);
  EXPECT_NE(json.find("\"transports\": \"loopback: in-process copies\""), std::string::npos) << json;
}

TEST(RunRank, BadOptionsNameParametersNotFlags) {
  RunOptions options;
  options.topology = Topology{2, 8, 12, 2, 1, 1};
  options.tensors = default_tensors(4096);
  options.agent.backend = "loopback";
  options.rounds = 0;
  auto groups = make_thread_groups(1);
  RunSummary summary = run_rank(*groups[0], options);
  ASSERT_FALSE(summary.status);
  EXPECT_EQ(summary.status.code(), Code::InvalidArgument);
  EXPECT_NE(summary.status.message().find("rounds must be in [1, 100000], got 0"), std::string::npos)
      << summary.status.message();
  EXPECT_EQ(summary.status.message().find("--"), std::string::npos) << summary.status.message();
}

}  // namespace
}  // namespace eplb
