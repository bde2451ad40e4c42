// int64 result arrays. Why one block and huge pages: on the virtual machines
// eplb was measured on, faulting in a fresh 4 KiB page costs 3-10 us, so the
// 1.4 MB of int64 results of a DeepSeek-V3 placement cost ~3 ms to write into
// freshly allocated numpy arrays, five times the policy itself (docs/python.md,
// bench/python_policy.py). One 2 MiB transparent huge page faults in at once
// (~0.1-0.3 ms). Smaller results use plain malloc. When huge pages are off,
// the advice is ignored and nothing else changes. Up to two released huge
// blocks of up to 4 MiB are kept for the next results (at most 8 MiB for the
// process's life), so repeated calls do not fault or zero their pages again.
#include <sys/mman.h>

#include <cstdlib>
#include <mutex>
#include <new>
#include <utility>
#include <vector>

#include "convert.h"

namespace eplb::python {
namespace {

constexpr size_t kHugePage = size_t(2) << 20;
constexpr size_t kHugeFrom = size_t(1) << 20;

constexpr size_t kKeptBlocks = 2;
constexpr size_t kKeptUpTo = 2 * kHugePage;

// Released huge blocks (pointer, size) waiting for the next result.
struct KeptBlocks {
  std::mutex mutex;
  std::vector<std::pair<void*, size_t>> blocks;
};
KeptBlocks& kept_blocks() {
  static KeptBlocks* kept = new KeptBlocks();  // never destroyed: capsules may outlive static destructors
  return *kept;
}

size_t huge_size(size_t bytes) { return (bytes + kHugePage - 1) / kHugePage * kHugePage; }

void* allocate_huge(size_t size) {
  {
    KeptBlocks& kept = kept_blocks();
    std::lock_guard lock(kept.mutex);
    for (size_t i = 0; i < kept.blocks.size(); ++i)
      if (kept.blocks[i].second == size) {
        void* block = kept.blocks[i].first;
        kept.blocks.erase(kept.blocks.begin() + i);
        return block;
      }
  }
  void* block = std::aligned_alloc(kHugePage, size);
  if (block) madvise(block, size, MADV_HUGEPAGE);  // advice only: failure changes nothing
  return block;
}

void release_huge(void* block, size_t size) {
  KeptBlocks& kept = kept_blocks();
  std::lock_guard lock(kept.mutex);
  if (kept.blocks.size() < kKeptBlocks && size <= kKeptUpTo) {
    kept.blocks.emplace_back(block, size);
    return;
  }
  std::free(block);
}

// A block of `bytes` and the capsule that releases it.
std::pair<void*, py::capsule> allocate_block(size_t bytes) {
  if (bytes >= kHugeFrom) {
    const size_t size = huge_size(bytes);
    if (void* block = allocate_huge(size)) {
      py::capsule owner(block, nullptr, [](PyObject* capsule) {
        // The block's size travels in the capsule's context.
        release_huge(PyCapsule_GetPointer(capsule, nullptr), reinterpret_cast<size_t>(PyCapsule_GetContext(capsule)));
      });
      PyCapsule_SetContext(owner.ptr(), reinterpret_cast<void*>(size));
      return {block, std::move(owner)};
    }
  }
  void* block = std::malloc(bytes == 0 ? 1 : bytes);
  if (!block) throw std::bad_alloc();
  return {block, py::capsule(block, [](void* memory) { std::free(memory); })};
}

size_t elements(const std::vector<py::ssize_t>& shape) {
  size_t count = 1;
  for (py::ssize_t extent : shape) count *= size_t(extent);
  return count;
}

}  // namespace

// int32 -> int64. The source and count are locals on purpose: read through a
// span, every int64 store might alias the span's size (long and unsigned long
// may alias), so the loop stayed scalar; this way it vectorizes (~4x fewer
// stores on the 1.4 MB of a DeepSeek-V3 result).
void widen(const int32_t* __restrict source, size_t count, int64_t* __restrict out) {
  for (size_t i = 0; i < count; ++i) out[i] = source[i];
}

Int64Block int64_block(size_t count) {
  auto [memory, owner] = allocate_block(count * sizeof(int64_t));
  return {static_cast<int64_t*>(memory), std::move(owner)};
}

std::vector<py::array_t<int64_t>> int64_arrays(const std::vector<Int64Part>& parts) {
  size_t total = 0;
  for (const Int64Part& part : parts) {
    if (elements(part.shape) != part.values.size())
      throw StatusError(Status(Code::Internal, "binding: a result's shape does not match its values"));
    total += part.values.size();
  }
  Int64Block block = int64_block(total);
  std::vector<py::array_t<int64_t>> arrays;
  int64_t* next = block.data;
  for (const Int64Part& part : parts) {
    widen(part.values.data(), part.values.size(), next);
    arrays.emplace_back(part.shape, next, block.owner);
    next += part.values.size();
  }
  return arrays;
}

py::array_t<int64_t> int64_array(std::span<const int32_t> values, const std::vector<py::ssize_t>& shape) {
  return int64_arrays({{values, shape}})[0];
}

}  // namespace eplb::python
