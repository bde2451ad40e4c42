// Expert store: layout encoding and agreement, rows of an owned arena or of
// adopted engine buffers, remembered checksums.
#include <xxhash.h>

#include <cstring>
#include <gtest/gtest.h>

#include "eplb/migrate.h"
#include "expert_content.h"

namespace eplb {
namespace {

using testing::three_tensors;

Topology small_topology() { return Topology{3, 8, 12, 2, 2, 4}; }

TEST(StoreLayout, EncodeDecodeRoundTripAndRejectsGarbage) {
  StoreLayout layout = StoreLayout::uniform(3, 4, three_tensors(1 << 16));
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
  StoreLayout reference = StoreLayout::uniform(4, 3, three_tensors(1 << 20));
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

  StoreLayout fewer_layers = StoreLayout::uniform(3, 3, three_tensors(1 << 20));
  Status layers = check_layouts_agree({reference.encode(), fewer_layers.encode()});
  EXPECT_NE(layers.message().find("rank 1 has 3 layers, rank 0 has 4"), std::string::npos) << layers.message();
  StoreLayout one_tensor = StoreLayout::uniform(4, 3, {{"weight", 1 << 20}});
  Status tensors = check_layouts_agree({reference.encode(), one_tensor.encode()});
  EXPECT_NE(tensors.message().find("rank 1 has 1 tensors in layer 0, rank 0 has 3"), std::string::npos)
      << tensors.message();
}

TEST(ExpertStore, RowsChecksumsAndRegions) {
  Topology topology = small_topology();
  StoreLayout layout = StoreLayout::uniform(topology.num_layers, topology.slots_per_rank(), three_tensors(8192));
  Placement placement = default_placement(topology);
  for (int rank = 0; rank < topology.num_ranks; ++rank) {
    auto store_or = ExpertStore::create_arena(layout, rank * topology.slots_per_rank());
    ASSERT_TRUE(store_or) << store_or.status().to_string();
    auto& store = **store_or;
    testing::fill_rows(store, placement);
    Status verified = testing::verify_rows(store, placement);
    EXPECT_TRUE(verified) << verified.to_string();
    EXPECT_EQ(store.row_bytes(2, 1), 2048u);
    EXPECT_EQ(store.row(2, 1, 1), store.row(2, 0, 1) + 2048);  // an arena's rows are packed
    EXPECT_EQ(store.checksum(2, 1, 1), XXH3_64bits(store.row(2, 1, 1), store.row_bytes(2, 1)));
    // Regions: the arena and the staging area.
    auto regions = store.regions();
    ASSERT_EQ(regions.size(), 2u);
    EXPECT_GE(regions[0].length, layout.total_bytes());
    EXPECT_GE(regions[1].length, layout.max_layer_bytes());
  }
}

TEST(ExpertStore, RemembersChecksumsUntilRowsAreRewritten) {
  Topology topology = small_topology();
  StoreLayout layout = StoreLayout::uniform(topology.num_layers, topology.slots_per_rank(), three_tensors(8192));
  auto store_or = ExpertStore::create_arena(layout, 0);
  ASSERT_TRUE(store_or) << store_or.status().to_string();
  auto& store = **store_or;
  testing::fill_rows(store, default_placement(topology));
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
  // Whoever rewrites a layer's rows forgets that layer's checksums only.
  (void)store.known_checksum(0, 0, 0);
  store.forget_checksums(1);
  EXPECT_FALSE(store.cached_checksum(1, 2, 0));
  EXPECT_TRUE(store.cached_checksum(0, 0, 0));
  store.forget_checksums();
  EXPECT_FALSE(store.cached_checksum(0, 0, 0));
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
  testing::fill_rows(store, placement);
  EXPECT_TRUE(testing::verify_rows(store, placement));
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

  // Buffers the agent allocated are registered already: not listed again.
  auto allocated = memory;
  allocated[0][1].registered = true;
  allocated[1][0].registered = true;
  auto adopted = ExpertStore::adopt(layout, 3, allocated);
  ASSERT_TRUE(adopted) << adopted.status().to_string();
  auto regions = (*adopted)->regions();
  ASSERT_EQ(regions.size(), 3u);  // two engine buffers + staging
  EXPECT_EQ(regions[0].address, buffers[0].data());
  EXPECT_EQ(regions[1].address, buffers[3].data());
}

}  // namespace
}  // namespace eplb
