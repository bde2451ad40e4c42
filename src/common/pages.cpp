// pages.cpp - populate and touch memory ahead of its first use (pages.h).
#include "pages.h"

#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>

namespace eplb::pages {
namespace {

#ifndef MADV_POPULATE_READ
constexpr int MADV_POPULATE_READ = 22;  // Linux 5.14
#endif
#ifndef MADV_POPULATE_WRITE
constexpr int MADV_POPULATE_WRITE = 23;  // Linux 5.14
#endif

struct PageRange {
  uintptr_t begin = 0, end = 0, page = 4096;
};

PageRange whole_pages(const void* address, size_t length) {
  PageRange range;
  range.page = uintptr_t(sysconf(_SC_PAGESIZE));
  range.begin = reinterpret_cast<uintptr_t>(address) & ~(range.page - 1);
  range.end = (reinterpret_cast<uintptr_t>(address) + length + range.page - 1) & ~(range.page - 1);
  return range;
}

}  // namespace

void prepare_for_reading(const void* address, size_t length) {
  if (address == nullptr || length == 0) return;
  const PageRange range = whole_pages(address, length);
  // Either call may be refused (an old kernel: EINVAL); then pages fault in
  // on first use as without it.
  (void)madvise(reinterpret_cast<void*>(range.begin), range.end - range.begin, MADV_POPULATE_READ);
  uint8_t sum = 0;
  for (uintptr_t page = range.begin; page < range.end; page += range.page)
    sum += *reinterpret_cast<const volatile uint8_t*>(page);
  asm volatile("" : : "r"(sum));
}

void prepare_for_writing(void* address, size_t length) {
  if (address == nullptr || length == 0) return;
  const PageRange range = whole_pages(address, length);
  (void)madvise(reinterpret_cast<void*>(range.begin), range.end - range.begin, MADV_HUGEPAGE);
  (void)madvise(reinterpret_cast<void*>(range.begin), range.end - range.begin, MADV_POPULATE_WRITE);
  // One byte in every page, never outside [address, address + length).
  const uintptr_t first = reinterpret_cast<uintptr_t>(address), last = first + length;
  for (uintptr_t byte = first; byte < last; byte = (byte & ~(range.page - 1)) + range.page)
    *reinterpret_cast<volatile uint8_t*>(byte) = 0;
}

}  // namespace eplb::pages
