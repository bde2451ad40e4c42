// pages_test.cpp - common/pages.h: populating and touching memory ahead of
// use leaves readable memory as it was, writes only inside the range, and
// accepts unaligned, empty and null ranges; kernel_page_size reads a
// mapping's page size.
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

TEST(Pages, KernelPageSizeIsTheMappingsOrZeroOutsideAny) {
  const size_t page = size_t(sysconf(_SC_PAGESIZE));
  Mapping before(4 * page), mapping(64 * page), after(4 * page);
  EXPECT_EQ(pages::kernel_page_size(mapping.memory), page);
  EXPECT_EQ(pages::kernel_page_size(mapping.memory + 63 * page + 17), page);
  int on_the_stack = 0;
  EXPECT_EQ(pages::kernel_page_size(&on_the_stack), page);
  // A hole: no mapping contains it.
  uint8_t* hole = static_cast<uint8_t*>(mmap(nullptr, 3 * page, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
  ASSERT_NE(hole, MAP_FAILED);
  ASSERT_EQ(munmap(hole + page, page), 0);
  EXPECT_EQ(pages::kernel_page_size(hole + page), 0u);
  EXPECT_EQ(pages::kernel_page_size(hole), page);
  munmap(hole, page);
  munmap(hole + 2 * page, page);
  EXPECT_EQ(pages::kernel_page_size(nullptr), 0u);
  // Huge pages (hugetlb) only where the machine has one reserved and free
  // (vm.nr_hugepages; bench/migrate_bandwidth.sh HUGEPAGES=N shows the arena
  // on them); this test does not change the machine's settings.
  const size_t huge = 2u << 20;
  void* hugetlb = mmap(nullptr, huge, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_HUGETLB, -1, 0);
  if (hugetlb != MAP_FAILED) {
    EXPECT_EQ(pages::kernel_page_size(hugetlb), huge);
    munmap(hugetlb, huge);
  }
}

}  // namespace
}  // namespace eplb
