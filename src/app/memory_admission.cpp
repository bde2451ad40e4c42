// memory_admission.cpp - what the ranks of `eplb run` on this machine will
// allocate, and whether this machine can hold it (include/eplb/app.h).
#include <fmt/format.h>
#include <string>

#include "common/text.h"
#include "eplb/app.h"

namespace eplb {
namespace {

constexpr uint64_t kPage = 4096;
uint64_t round_up(uint64_t value, uint64_t multiple) { return (value + multiple - 1) / multiple * multiple; }

}  // namespace

RankMemory rank_memory(const StoreLayout& layout, bool spare_buffers) {
  RankMemory memory;
  for (const auto& tensors : layout.layers)
    for (const auto& tensor : tensors)
      memory.arena_bytes = round_up(memory.arena_bytes + tensor.bytes_per_expert * uint64_t(layout.slots_per_rank),
                                    kPage);
  memory.arena_bytes = std::max<uint64_t>(memory.arena_bytes, kPage);
  memory.staging_bytes = round_up(std::max<uint64_t>(layout.max_layer_bytes(), 1), kPage);
  if (spare_buffers) memory.spare_bytes = memory.arena_bytes;
  return memory;
}

Status admit_memory(const RankMemory& per_rank, int local_ranks, bool arena_in_shared_memory,
                    const MachineMemory& machine) {
  const uint64_t ranks = uint64_t(std::max(local_ranks, 1));
  const uint64_t arena = per_rank.arena_bytes + per_rank.spare_bytes;  // one allocation
  const uint64_t per_rank_total = arena + per_rank.staging_bytes + kRankOverheadBytes;
  const uint64_t need = per_rank_total * ranks;  // <= 4096 ranks x ~2 TiB: no overflow
  const uint64_t limit = machine.available_bytes / 10 * 9;
  const std::string spare =
      per_rank.spare_bytes ? fmt::format(" + {} spare buffers (--commit swap)", format_bytes(per_rank.spare_bytes)) : "";
  const std::string each = fmt::format("{} rank(s) x ({} arena{} + {} staging + {} process and transport overhead)",
                                       ranks, format_bytes(per_rank.arena_bytes), spare,
                                       format_bytes(per_rank.staging_bytes), format_bytes(kRankOverheadBytes));
  if (machine.available_bytes > 0 && need > limit)
    return error(Code::InvalidArgument,
                 fmt::format("memory admission: this machine's ranks would allocate {} = {}, more than 90% of "
                             "MemAvailable {} ({}); use fewer or smaller experts, fewer layers or fewer ranks",
                             format_bytes(need), each, format_bytes(machine.available_bytes), machine.source));
  const uint64_t shared = arena * ranks;
  if (arena_in_shared_memory && machine.shm_free_bytes > 0 && shared > machine.shm_free_bytes)
    return error(Code::InvalidArgument,
                 fmt::format("memory admission: this machine's ranks would place {} = {} rank(s) x {} arena{} in "
                             "shared memory, more than the {} free in /dev/shm ({})",
                             format_bytes(shared), ranks, format_bytes(arena), per_rank.spare_bytes ? " with spares" : "",
                             format_bytes(machine.shm_free_bytes), machine.source));
  return Status::ok();
}

}  // namespace eplb
