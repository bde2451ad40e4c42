// Expert store: layout encoding and agreement, default tensors, size and
// --tensors parsing, simulated fill, checksums and byte-for-byte verification.
#include <xxhash.h>

#include <cstring>
#include <gtest/gtest.h>

#include "eplb/migrate.h"
#include "eplb/sim.h"

namespace eplb {
namespace {

Topology small_topology() { return Topology{3, 8, 12, 2, 2, 4}; }

TEST(StoreLayout, DefaultTensorsAddUpAndDiffer) {
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

TEST(StoreLayout, ParsesSizesAndTensors) {
  EXPECT_EQ(*parse_byte_size("4096"), 4096u);
  EXPECT_EQ(*parse_byte_size("1MiB"), 1u << 20);
  EXPECT_EQ(*parse_byte_size("8M"), 8u << 20);
  EXPECT_EQ(*parse_byte_size("512KiB"), 512u << 10);
  EXPECT_EQ(*parse_byte_size("1.5KiB"), 1536u);
  for (const char* bad : {"", "MiB", "1XB", "-4", "0", "1.3B", "2TiB"}) EXPECT_FALSE(parse_byte_size(bad)) << bad;
  auto tensors = parse_tensors("gate_up:2MiB,down:1MiB,scales:8KiB");
  ASSERT_TRUE(tensors) << tensors.status().to_string();
  ASSERT_EQ(tensors->size(), 3u);
  EXPECT_EQ((*tensors)[1].name, "down");
  EXPECT_EQ((*tensors)[2].bytes_per_expert, 8192u);
  for (const char* bad : {"", "a", "a:", ":4", "a:4,,b:4", "a:4,a:8", "a b:4", "a:x"})
    EXPECT_FALSE(parse_tensors(bad)) << bad;
  auto dup = parse_tensors("w:4,w:8");
  EXPECT_NE(dup.status().message().find("twice"), std::string::npos);
}

TEST(StoreLayout, EncodeDecodeRoundTripAndRejectsGarbage) {
  StoreLayout layout = StoreLayout::uniform(3, 4, default_tensors(1 << 16));
  layout.layers[1][0].bytes_per_expert += 64;  // layers may differ
  auto decoded = StoreLayout::decode(layout.encode());
  ASSERT_TRUE(decoded) << decoded.status().to_string();
  EXPECT_EQ(decoded->layers, layout.layers);
  EXPECT_EQ(decoded->slots_per_rank, 4);
  std::string bytes = layout.encode();
  for (size_t cut = 0; cut < bytes.size(); ++cut) {
    auto truncated = StoreLayout::decode(std::string_view(bytes).substr(0, cut));
    ASSERT_FALSE(truncated) << cut;
    EXPECT_EQ(truncated.status().code(), Code::Mismatch);
  }
  std::string flipped = bytes;
  flipped[0] ^= 1;
  EXPECT_FALSE(StoreLayout::decode(flipped));
  EXPECT_FALSE(StoreLayout::decode(bytes + "x"));
}

TEST(StoreLayout, MismatchNamesRankLayerTensorAndBothSizes) {
  StoreLayout reference = StoreLayout::uniform(4, 3, default_tensors(1 << 20));
  StoreLayout other = reference;
  other.layers[2][1].bytes_per_expert -= 64;
  Status same = check_layouts_agree({reference.encode(), reference.encode(), reference.encode()});
  EXPECT_TRUE(same) << same.to_string();
  Status status = check_layouts_agree({reference.encode(), reference.encode(), other.encode()});
  ASSERT_FALSE(status);
  EXPECT_EQ(status.code(), Code::Mismatch);
  const std::string& text = status.message();
  EXPECT_NE(text.find("nbytes_per_expert mismatch"), std::string::npos) << text;
  EXPECT_NE(text.find("rank 2"), std::string::npos) << text;
  EXPECT_NE(text.find("layer 2"), std::string::npos) << text;
  EXPECT_NE(text.find("'down'"), std::string::npos) << text;
  EXPECT_NE(text.find(std::to_string(reference.layers[2][1].bytes_per_expert)), std::string::npos) << text;
  EXPECT_NE(text.find(std::to_string(other.layers[2][1].bytes_per_expert)), std::string::npos) << text;

  StoreLayout fewer_layers = StoreLayout::uniform(3, 3, default_tensors(1 << 20));
  Status layers = check_layouts_agree({reference.encode(), fewer_layers.encode()});
  EXPECT_NE(layers.message().find("rank 1 has 3 layers, rank 0 has 4"), std::string::npos) << layers.message();
  StoreLayout one_tensor = StoreLayout::uniform(4, 3, {{"weight", 1 << 20}});
  Status tensors = check_layouts_agree({reference.encode(), one_tensor.encode()});
  EXPECT_NE(tensors.message().find("rank 1 has 1 tensors in layer 0, rank 0 has 3"), std::string::npos)
      << tensors.message();
}

TEST(ExpertStore, FillVerifyAndChecksum) {
  Topology topology = small_topology();
  StoreLayout layout = StoreLayout::uniform(topology.num_layers, topology.slots_per_rank(), default_tensors(8192));
  Placement placement = default_placement(topology);
  for (int rank = 0; rank < topology.num_ranks; ++rank) {
    auto store_or = ExpertStore::create_arena(layout, rank * topology.slots_per_rank());
    ASSERT_TRUE(store_or) << store_or.status().to_string();
    auto& store = **store_or;
    store.fill_simulated(placement);
    Status verified = store.verify_simulated(placement);
    EXPECT_TRUE(verified) << verified.to_string();
    // The row holds exactly fill_expert_bytes of its expert.
    int slot = rank * topology.slots_per_rank() + 1;
    int expert = placement.phy2log(2, slot);
    std::vector<uint8_t> expected(store.row_bytes(2, 1));
    fill_expert_bytes(2, expert, 1, 0, expected);
    EXPECT_EQ(std::memcmp(store.row(2, 1, 1), expected.data(), expected.size()), 0);
    EXPECT_EQ(store.checksum(2, 1, 1), XXH3_64bits(expected.data(), expected.size()));
    // Regions: the arena and the staging area.
    auto regions = store.regions();
    ASSERT_EQ(regions.size(), 2u);
    EXPECT_GE(regions[0].length, layout.total_bytes());
    EXPECT_GE(regions[1].length, layout.max_layer_bytes());
  }
}

TEST(ExpertStore, RemembersChecksumsUntilRowsAreRewritten) {
  Topology topology = small_topology();
  StoreLayout layout = StoreLayout::uniform(topology.num_layers, topology.slots_per_rank(), default_tensors(8192));
  auto store_or = ExpertStore::create_arena(layout, 0);
  ASSERT_TRUE(store_or) << store_or.status().to_string();
  auto& store = **store_or;
  store.fill_simulated(default_placement(topology));
  EXPECT_FALSE(store.cached_checksum(1, 2, 0));
  const uint64_t sum = store.known_checksum(1, 2, 0);
  EXPECT_EQ(sum, XXH3_64bits(store.row(1, 2, 0), store.row_bytes(1, 0)));
  ASSERT_TRUE(store.cached_checksum(1, 2, 0));
  EXPECT_EQ(*store.cached_checksum(1, 2, 0), sum);
  // Remembered, not recomputed: a value recorded by a commit is returned.
  store.remember_checksum(1, 2, 0, 42);
  EXPECT_EQ(store.known_checksum(1, 2, 0), 42u);
  store.remember_checksum(1, 2, 0, std::nullopt);
  EXPECT_EQ(store.known_checksum(1, 2, 0), sum);
  // Rewriting through the store forgets the layer's checksums.
  store.fill_simulated(default_placement(topology), 1);
  EXPECT_FALSE(store.cached_checksum(1, 2, 0));
  (void)store.known_checksum(0, 0, 0);
  store.forget_checksums();
  EXPECT_FALSE(store.cached_checksum(0, 0, 0));
}

TEST(ExpertStore, VerifyNamesTheSlotExpertTensorAndOffset) {
  Topology topology = small_topology();
  StoreLayout layout = StoreLayout::uniform(topology.num_layers, topology.slots_per_rank(), default_tensors(8192));
  Placement placement = default_placement(topology);
  auto store = std::move(ExpertStore::create_arena(layout, 3)).value();
  store->fill_simulated(placement);
  store->row(1, 2, 0)[100] ^= 0x5a;
  Status status = store->verify_simulated(placement);
  ASSERT_FALSE(status);
  EXPECT_NE(status.message().find("layer 1 slot 5 should hold expert " + std::to_string(placement.phy2log(1, 5))),
            std::string::npos)
      << status.message();
  EXPECT_NE(status.message().find("tensor 'gate_up' differs at byte 100"), std::string::npos) << status.message();
  // Swapping the content of two slots holding different experts is caught too.
  store->fill_simulated(placement);
  std::vector<uint8_t> keep(store->row_bytes(0, 2));
  for (int t = 0; t < 3; ++t) {
    keep.resize(store->row_bytes(0, t));
    std::memcpy(keep.data(), store->row(0, 0, t), keep.size());
    std::memcpy(store->row(0, 0, t), store->row(0, 1, t), keep.size());
    std::memcpy(store->row(0, 1, t), keep.data(), keep.size());
  }
  EXPECT_FALSE(store->verify_simulated(placement));
}

TEST(ExpertStore, AdoptsEngineBuffersWithStride) {
  StoreLayout layout = StoreLayout::uniform(2, 3, {{"a", 100}, {"b", 48}});
  std::vector<std::vector<uint8_t>> buffers;
  std::vector<std::vector<TensorMemory>> memory(2);
  for (int l = 0; l < 2; ++l)
    for (int t = 0; t < 2; ++t) {
      buffers.emplace_back(3 * 128, 0xee);
      memory[l].push_back({buffers.back().data(), 128});
    }
  auto store_or = ExpertStore::adopt(layout, 3, memory);
  ASSERT_TRUE(store_or) << store_or.status().to_string();
  auto& store = **store_or;
  EXPECT_EQ(store.row(1, 2, 1), buffers[3].data() + 256);
  Topology topology{2, 4, 6, 1, 1, 2};
  Placement placement = default_placement(topology);
  store.fill_simulated(placement);
  EXPECT_TRUE(store.verify_simulated(placement));
  EXPECT_EQ(buffers[0][100], 0xee);  // the gap after a row is not touched
  EXPECT_EQ(store.regions().size(), 5u);  // four engine buffers + staging

  auto wrong = memory;
  wrong[1].pop_back();
  EXPECT_FALSE(ExpertStore::adopt(layout, 3, wrong));
  wrong = memory;
  wrong[0][0].row_stride = 50;
  auto narrow = ExpertStore::adopt(layout, 3, wrong);
  ASSERT_FALSE(narrow);
  EXPECT_NE(narrow.status().message().find("row stride"), std::string::npos);
  EXPECT_FALSE(ExpertStore::adopt(layout, 2, memory));  // not a multiple of the slots per rank
}

}  // namespace
}  // namespace eplb
