// pages.cpp - populate and touch memory ahead of its first use (pages.h).
#include "pages.h"

#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <fstream>
#include <string>

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

// [begin, end) of a smaps mapping line ("7f..-7f.. rw-s ..."); false for
// the field lines ("Size:  4 kB").
bool mapping_range(const std::string& line, uintptr_t* begin, uintptr_t* end) {
  unsigned long long first = 0, last = 0;
  int consumed = 0;
  if (std::sscanf(line.c_str(), "%llx-%llx %n", &first, &last, &consumed) != 2 || consumed == 0) return false;
  *begin = uintptr_t(first);
  *end = uintptr_t(last);
  return true;
}

}  // namespace

size_t kernel_page_size(const void* address) {
  std::ifstream smaps("/proc/self/smaps");
  const uintptr_t wanted = reinterpret_cast<uintptr_t>(address);
  bool inside = false;
  for (std::string line; std::getline(smaps, line);) {
    uintptr_t begin = 0, end = 0;
    if (mapping_range(line, &begin, &end)) {
      inside = begin <= wanted && wanted < end;
      continue;
    }
    unsigned long long kib = 0;
    if (inside && std::sscanf(line.c_str(), "KernelPageSize: %llu kB", &kib) == 1) return size_t(kib) * 1024;
  }
  return 0;
}

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
