// Synthetic expert bytes: deterministic, offset-consistent, distinct per tensor.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <set>
#include <vector>

#include "eplb/sim.h"

namespace eplb {
namespace {

std::vector<uint8_t> fill(int layer, int expert, int tensor, uint64_t offset, size_t size) {
  std::vector<uint8_t> out(size);
  fill_expert_bytes(layer, expert, tensor, offset, out);
  return out;
}

TEST(ExpertBytes, Deterministic) {
  EXPECT_EQ(fill(3, 17, 2, 0, 4096), fill(3, 17, 2, 0, 4096));
  // Pinned: the format of synthetic weights must not change silently (peers
  // built from different versions would disagree on every checksum).
  std::vector<uint8_t> head = fill(0, 0, 0, 0, 8);
  uint64_t word = 0;
  for (int i = 7; i >= 0; --i) word = word << 8 | head[size_t(i)];
  EXPECT_EQ(word, 16852473371444490038ull) << std::hex << word;
}

TEST(ExpertBytes, AnySliceEqualsTheSameBytesOfABigFill) {
  const size_t size = 1 << 16;
  std::vector<uint8_t> whole = fill(5, 9, 1, 0, size);
  uint64_t state = 99;
  for (int trial = 0; trial < 2000; ++trial) {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    size_t offset = (state >> 20) % size;
    size_t length = (state >> 44) % 100;
    if (trial % 3 == 0) length = (state >> 40) % 3000;
    length = std::min(length, size - offset);
    std::vector<uint8_t> part = fill(5, 9, 1, offset, length);
    ASSERT_TRUE(std::equal(part.begin(), part.end(), whole.begin() + std::ptrdiff_t(offset))) << offset << " +" << length;
  }
  // Every (offset mod 8, length mod 8) combination around a word boundary.
  for (size_t offset = 1000; offset < 1016; ++offset)
    for (size_t length = 0; length < 24; ++length) {
      std::vector<uint8_t> part = fill(5, 9, 1, offset, length);
      ASSERT_TRUE(std::equal(part.begin(), part.end(), whole.begin() + std::ptrdiff_t(offset))) << offset << " +" << length;
    }
  // Offsets far beyond 32 bits work the same way.
  uint64_t far = (uint64_t(1) << 40) + 3;
  std::vector<uint8_t> big = fill(1, 2, 3, far - 3, 64);
  std::vector<uint8_t> tail = fill(1, 2, 3, far, 61);
  EXPECT_EQ(0, std::memcmp(big.data() + 3, tail.data(), 61));
}

TEST(ExpertBytes, DifferentTensorsDifferInEveryWord) {
  std::set<std::vector<uint8_t>> seen;
  const std::vector<uint8_t> reference = fill(0, 0, 0, 0, 256);
  for (int layer = 0; layer < 4; ++layer)
    for (int expert = 0; expert < 64; ++expert)
      for (int tensor = 0; tensor < 3; ++tensor) {
        std::vector<uint8_t> bytes = fill(layer, expert, tensor, 0, 256);
        EXPECT_TRUE(seen.insert(bytes).second) << layer << " " << expert << " " << tensor;
        if (layer || expert || tensor) {
          for (size_t w = 0; w < 32; ++w)
            EXPECT_NE(0, std::memcmp(bytes.data() + w * 8, reference.data() + w * 8, 8)) << w;
        }
      }
  // Large and negative indices (folded by hashing) still differ.
  EXPECT_NE(fill(1 << 21, 0, 0, 0, 64), fill(0, 0, 0, 0, 64));
  EXPECT_NE(fill(-1, 0, 0, 0, 64), fill(0, 0, 0, 0, 64));
  EXPECT_NE(fill(0, 1 << 25, 0, 0, 64), fill(0, 0, 0, 0, 64));
}

TEST(ExpertBytes, LooksRandom) {
  std::vector<uint8_t> bytes = fill(2, 3, 0, 0, 1 << 16);
  size_t counts[256] = {};
  for (uint8_t b : bytes) ++counts[b];
  for (size_t c : counts) {
    EXPECT_GT(c, 256u / 2);
    EXPECT_LT(c, 256u * 2);
  }
}

TEST(ExpertBytes, EmptyOutputWritesNothing) {
  std::vector<uint8_t> guard(16, 0xa5);
  fill_expert_bytes(1, 1, 1, 12345, std::span<uint8_t>(guard.data() + 8, 0));
  EXPECT_EQ(guard, std::vector<uint8_t>(16, 0xa5));
  // A one-byte output at that offset is the byte a larger fill puts there.
  std::vector<uint8_t> whole(12346 + 8), one(1);
  fill_expert_bytes(1, 1, 1, 0, whole);
  fill_expert_bytes(1, 1, 1, 12345, one);
  EXPECT_EQ(one[0], whole[12345]);
}

}  // namespace
}  // namespace eplb
