// store.cpp - ExpertStore: this rank's live expert rows (an owned arena or
// engine buffers), the staging area and the rows' checksums.
#include <fmt/format.h>
#include <sys/mman.h>
#include <xxhash.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "common/pages.h"
#include "eplb/migrate.h"

namespace eplb {
namespace {

constexpr uint64_t kPage = 4096;
uint64_t round_up(uint64_t value, uint64_t multiple) { return (value + multiple - 1) / multiple * multiple; }

Result<uint8_t*> map_bytes(uint64_t bytes, const char* what) {
  void* memory = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (memory == MAP_FAILED)
    return error(Code::Internal, std::string("expert store: cannot map ") + format_bytes(bytes) + " for the " +
                                     what + ": " + std::strerror(errno));
  return static_cast<uint8_t*>(memory);
}

// The staging area (and the spare buffers) are rewritten for every layer of
// every round: back them with transparent huge pages where the kernel
// allows (fewer TLB misses), and populate and touch them now rather than
// during the first layer's transfers (common/pages.h says why touching
// matters).
void prepare_staging(uint8_t* memory, uint64_t bytes) { pages::prepare_for_writing(memory, bytes); }

}  // namespace

ExpertStore::~ExpertStore() {
  // An agent-allocated arena belongs to the agent (freed with it).
  if (arena_ && !agent_region_) munmap(arena_, arena_bytes_);
  if (staging_) munmap(staging_, staging_bytes_);
}

static Status check_first_slot(const StoreLayout& layout, int first_slot) {
  if (first_slot < 0 || first_slot % layout.slots_per_rank != 0)
    return error(Code::InvalidArgument,
                 fmt::format("expert store: first slot {} is not a multiple of the slots per rank ({})", first_slot,
                             layout.slots_per_rank));
  return Status::ok();
}

Result<std::unique_ptr<ExpertStore>> ExpertStore::create_arena(const StoreLayout& layout, int first_slot,
                                                              xfer::Agent* agent, bool spare_buffers) {
  EPLB_TRY(layout.validate());
  EPLB_TRY(check_first_slot(layout, first_slot));
  std::unique_ptr<ExpertStore> store(new ExpertStore());
  store->layout_ = layout;
  store->first_slot_ = first_slot;
  // Arena: layer by layer, tensor by tensor, each tensor block [S][bytes]
  // packed and page aligned.
  uint64_t offset = 0;
  std::vector<std::vector<uint64_t>> offsets(layout.layers.size());
  for (size_t l = 0; l < layout.layers.size(); ++l)
    for (const auto& tensor : layout.layers[l]) {
      offsets[l].push_back(offset);
      offset = round_up(offset + tensor.bytes_per_expert * uint64_t(layout.slots_per_rank), kPage);
    }
  const uint64_t buffer_bytes = std::max<uint64_t>(offset, kPage);
  // With spares: buffer 1 of every layer lies buffer_bytes after buffer 0.
  store->arena_bytes_ = spare_buffers ? 2 * buffer_bytes : buffer_bytes;
  if (agent) {
    auto allocated = agent->allocate_memory(store->arena_bytes_);
    if (allocated) {
      store->agent_ = agent;
      store->agent_region_ = allocated->id;
      store->arena_ = static_cast<uint8_t*>(allocated->address);
    } else if (allocated.status().code() != Code::Unsupported) {
      return allocated.status().with_context("expert store: allocating the arena through the transfer agent");
    }
  }
  if (!store->arena_) {
    EPLB_ASSIGN_OR_RETURN(store->arena_, map_bytes(store->arena_bytes_, "expert arena"));
  }
  store->arena_page_bytes_ = pages::kernel_page_size(store->arena_);
  // The spares are first written during a round: fault them in now.
  if (spare_buffers) prepare_staging(store->arena_ + buffer_bytes, buffer_bytes);
  store->memory_.resize(layout.layers.size());
  if (spare_buffers) store->spare_.resize(layout.layers.size());
  for (size_t l = 0; l < layout.layers.size(); ++l)
    for (size_t t = 0; t < layout.layers[l].size(); ++t) {
      const uint64_t stride = layout.layers[l][t].bytes_per_expert;
      store->memory_[l].push_back({store->arena_ + offsets[l][t], stride});
      if (spare_buffers) store->spare_[l].push_back({store->arena_ + buffer_bytes + offsets[l][t], stride});
    }
  EPLB_TRY(store->finish_setup(StoreStaging::Kind::Allocate));
  return store;
}

// Checks engine buffers [layer][tensor] against the layout and resolves
// packed strides; `what` names them ("engine memory", "spare memory").
static Status check_engine_memory(const StoreLayout& layout, std::vector<std::vector<TensorMemory>>& memory,
                                  const char* what) {
  if (memory.size() != layout.layers.size())
    return error(Code::InvalidArgument, fmt::format("expert store: {} lists {} layers, the layout has {}", what,
                                                    memory.size(), layout.layers.size()));
  for (size_t l = 0; l < memory.size(); ++l) {
    if (memory[l].size() != layout.layers[l].size())
      return error(Code::InvalidArgument,
                   fmt::format("expert store: {} of layer {} lists {} tensors, the layout has {}", what, l,
                               memory[l].size(), layout.layers[l].size()));
    for (size_t t = 0; t < memory[l].size(); ++t) {
      auto& buffer = memory[l][t];
      const auto& tensor = layout.layers[l][t];
      if (buffer.row_stride == 0) buffer.row_stride = tensor.bytes_per_expert;
      if (buffer.address == nullptr || buffer.row_stride < tensor.bytes_per_expert)
        return error(Code::InvalidArgument,
                     fmt::format("expert store: {} of layer {} tensor '{}' is null or its row stride ({} B) is "
                                 "below its {} B per expert",
                                 what, l, tensor.name, buffer.row_stride, tensor.bytes_per_expert));
    }
  }
  return Status::ok();
}

// An engine's staging buffer ([tensor], one layer's shape) against every
// layer of the layout.
static Status check_engine_staging(const StoreLayout& layout, std::vector<TensorMemory>& staging) {
  for (size_t l = 0; l < layout.layers.size(); ++l) {
    if (staging.size() != layout.layers[l].size())
      return error(Code::InvalidArgument, fmt::format("expert store: the engine's staging buffer has {} tensors, layer "
                                                      "{} has {}",
                                                      staging.size(), l, layout.layers[l].size()));
    for (size_t t = 0; t < staging.size(); ++t) {
      const auto& tensor = layout.layers[l][t];
      if (staging[t].row_stride == 0) staging[t].row_stride = tensor.bytes_per_expert;
      if (staging[t].address == nullptr || staging[t].row_stride != tensor.bytes_per_expert)
        return error(Code::InvalidArgument,
                     fmt::format("expert store: the engine's staging buffer tensor {} is null or its rows ({} B) are "
                                 "not layer {} tensor '{}''s {} B",
                                 t, staging[t].row_stride, l, tensor.name, tensor.bytes_per_expert));
    }
  }
  return Status::ok();
}

Result<std::unique_ptr<ExpertStore>> ExpertStore::adopt(const StoreLayout& layout, int first_slot,
                                                        std::vector<std::vector<TensorMemory>> memory,
                                                        std::vector<std::vector<TensorMemory>> spare,
                                                        StoreStaging staging) {
  EPLB_TRY(layout.validate());
  EPLB_TRY(check_first_slot(layout, first_slot));
  EPLB_TRY(check_engine_memory(layout, memory, "engine memory"));
  if (!spare.empty()) EPLB_TRY(check_engine_memory(layout, spare, "spare memory"));
  if (staging.kind == StoreStaging::Kind::Engine) EPLB_TRY(check_engine_staging(layout, staging.engine));
  std::unique_ptr<ExpertStore> store(new ExpertStore());
  store->layout_ = layout;
  store->first_slot_ = first_slot;
  store->memory_ = std::move(memory);
  store->spare_ = std::move(spare);
  store->engine_staging_ = std::move(staging.engine);
  EPLB_TRY(store->finish_setup(staging.kind));
  return store;
}

Status ExpertStore::finish_setup(StoreStaging::Kind staging) {
  // Staging for the largest layer: tensor blocks [S][bytes] packed.
  staging_offsets_.resize(layout_.layers.size());
  for (size_t l = 0; l < layout_.layers.size(); ++l) {
    uint64_t at = 0;
    for (const auto& tensor : layout_.layers[l]) {
      staging_offsets_[l].push_back(at);
      at += tensor.bytes_per_expert * uint64_t(layout_.slots_per_rank);
    }
  }
  if (staging == StoreStaging::Kind::Allocate) {
    staging_bytes_ = round_up(std::max<uint64_t>(layout_.max_layer_bytes(), 1), kPage);
    EPLB_TRY(admit_allocation(staging_bytes_, false, "expert store: the staging area (the largest layer)"));
    EPLB_ASSIGN_OR_RETURN(staging_, map_bytes(staging_bytes_, "staging area"));
    prepare_staging(staging_, staging_bytes_);
  }
  for (int l = 0; l < layout_.num_layers(); ++l) reset_checksums(l);
  live_.assign(layout_.layers.size(), 0);
  return Status::ok();
}

uint8_t* ExpertStore::buffer_row(int layer, int buffer, int local_slot, int tensor) const {
  const TensorMemory& memory = buffer == live_[layer] ? memory_[layer][tensor] : spare_[layer][tensor];
  return memory.address + uint64_t(local_slot) * memory.row_stride;
}

uint8_t* ExpertStore::spare_row(int layer, int local_slot, int tensor) const {
  const TensorMemory& memory = spare_[layer][tensor];
  return memory.address + uint64_t(local_slot) * memory.row_stride;
}

void ExpertStore::swap_layer(int layer, std::vector<std::optional<uint64_t>> sums) {
  std::swap(memory_[layer], spare_[layer]);
  live_[layer] ^= 1;
  checksums_[layer] = std::move(sums);
}

uint8_t* ExpertStore::row(int layer, int local_slot, int tensor) const {
  const TensorMemory& memory = memory_[layer][tensor];
  return memory.address + uint64_t(local_slot) * memory.row_stride;
}

uint8_t* ExpertStore::staging_row(int layer, int local_slot, int tensor) const {
  if (!engine_staging_.empty())
    return engine_staging_[tensor].address + uint64_t(local_slot) * engine_staging_[tensor].row_stride;
  if (!staging_) return nullptr;
  return staging_ + staging_offsets_[layer][tensor] +
         uint64_t(local_slot) * layout_.layers[layer][tensor].bytes_per_expert;
}

uint64_t ExpertStore::checksum(int layer, int local_slot, int tensor) const {
  return XXH3_64bits(row(layer, local_slot, tensor), row_bytes(layer, tensor));
}

void ExpertStore::reset_checksums(int layer) {
  checksums_.resize(layout_.layers.size());
  checksums_[layer].assign(size_t(slots_per_rank()) * layout_.layers[layer].size(), std::nullopt);
}

std::optional<uint64_t> ExpertStore::cached_checksum(int layer, int local_slot, int tensor) const {
  return checksums_[layer][size_t(local_slot) * layout_.layers[layer].size() + size_t(tensor)];
}

uint64_t ExpertStore::known_checksum(int layer, int local_slot, int tensor) {
  auto& cached = checksums_[layer][size_t(local_slot) * layout_.layers[layer].size() + size_t(tensor)];
  if (!cached) cached = checksum(layer, local_slot, tensor);
  return *cached;
}

void ExpertStore::remember_checksum(int layer, int local_slot, int tensor, std::optional<uint64_t> value) {
  checksums_[layer][size_t(local_slot) * layout_.layers[layer].size() + size_t(tensor)] = value;
}

void ExpertStore::forget_checksums() {
  for (int l = 0; l < layout_.num_layers(); ++l) reset_checksums(l);
}

void ExpertStore::forget_checksums(int layer) {
  if (layer >= 0 && layer < layout_.num_layers()) reset_checksums(layer);
}

uint64_t ExpertStore::span_bytes(size_t layer, size_t tensor, const TensorMemory& buffer) const {
  return buffer.row_stride * uint64_t(layout_.slots_per_rank - 1) + layout_.layers[layer][tensor].bytes_per_expert;
}

uint64_t ExpertStore::spare_bytes() const {
  if (arena_) return has_spare() ? arena_bytes_ / 2 : 0;
  uint64_t bytes = 0;
  for (size_t l = 0; l < spare_.size(); ++l)
    for (size_t t = 0; t < spare_[l].size(); ++t) bytes += span_bytes(l, t, spare_[l][t]);
  return bytes;
}

std::vector<xfer::MemoryRegion> ExpertStore::regions() const {
  std::vector<xfer::MemoryRegion> regions;
  if (arena_) {
    if (!agent_region_) regions.push_back({arena_, arena_bytes_, xfer::MemoryKind::Host, 0});
  } else {
    for (const auto* buffers : {&memory_, &spare_})
      for (size_t l = 0; l < buffers->size(); ++l)
        for (size_t t = 0; t < (*buffers)[l].size(); ++t) {
          const TensorMemory& buffer = (*buffers)[l][t];
          if (buffer.registered) continue;
          regions.push_back({buffer.address, span_bytes(l, t, buffer), xfer::MemoryKind::Host, 0});
        }
  }
  if (staging_) regions.push_back({staging_, staging_bytes_, xfer::MemoryKind::Host, 0});
  for (const TensorMemory& buffer : engine_staging_)
    if (!buffer.registered)
      regions.push_back({buffer.address, buffer.row_stride * uint64_t(slots_per_rank()), xfer::MemoryKind::Host, 0});
  return regions;
}

}  // namespace eplb
