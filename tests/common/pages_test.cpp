// pages_test.cpp - common/pages.h: populating and touching memory ahead of
// use leaves readable memory as it was, writes only inside the range, and
// accepts unaligned, empty and null ranges.
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <vector>

#include "common/pages.h"

namespace eplb {
namespace {

struct Mapping {
  explicit Mapping(size_t bytes) : size(bytes) {
    memory = static_cast<uint8_t*>(mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
  }
  ~Mapping() { munmap(memory, size); }
  size_t size;
  uint8_t* memory;
};

TEST(Pages, PreparingForReadingLeavesTheContentAsItWas) {
  Mapping mapping(16 * 4096);
  ASSERT_NE(mapping.memory, MAP_FAILED);
  for (size_t i = 0; i < mapping.size; ++i) mapping.memory[i] = uint8_t(i * 7 + 3);
  pages::prepare_for_reading(mapping.memory + 100, mapping.size - 200);
  for (size_t i = 0; i < mapping.size; ++i) ASSERT_EQ(mapping.memory[i], uint8_t(i * 7 + 3)) << "byte " << i;
}

TEST(Pages, PreparingForWritingWritesOnlyInsideTheRangeAndIntoEveryPage) {
  const size_t page = size_t(sysconf(_SC_PAGESIZE));
  Mapping mapping(8 * page);
  ASSERT_NE(mapping.memory, MAP_FAILED);
  std::memset(mapping.memory, 0xAB, mapping.size);
  // From the middle of page 1 to the middle of page 5: bytes outside keep
  // 0xAB; inside, the first byte and the first byte of pages 2..5 become 0.
  uint8_t* begin = mapping.memory + page + page / 2;
  uint8_t* end = mapping.memory + 5 * page + page / 2;
  pages::prepare_for_writing(begin, size_t(end - begin));
  for (uint8_t* byte = mapping.memory; byte < mapping.memory + mapping.size; ++byte) {
    const bool inside = byte >= begin && byte < end;
    const bool touched = byte == begin || (inside && (byte - mapping.memory) % page == 0);
    ASSERT_EQ(*byte, touched ? 0 : 0xAB) << "byte " << (byte - mapping.memory);
  }
}

TEST(Pages, EmptyAndNullRangesAreNothingToDo) {
  pages::prepare_for_reading(nullptr, 4096);
  pages::prepare_for_writing(nullptr, 4096);
  uint8_t byte = 5;
  pages::prepare_for_reading(&byte, 0);
  pages::prepare_for_writing(&byte, 0);
  EXPECT_EQ(byte, 5);
  pages::prepare_for_writing(&byte, 1);  // a range inside one page
  EXPECT_EQ(byte, 0);
}

}  // namespace
}  // namespace eplb
