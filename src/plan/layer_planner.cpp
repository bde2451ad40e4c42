// The per-layer planning algorithm (rules in eplb/plan.h and docs/plan.md).
//
// 1. Index the old mapping: the old replicas of every expert, by slot.
// 2. Classify, rank by rank and slot by slot: Keep if unchanged; LocalCopy
//    from the lowest old slot of the rank holding the expert; LocalCopy after
//    read if this rank already reads the expert in this layer; otherwise a
//    RemoteRead whose source is chosen later.
// 3. Choose sources in two passes: first every read that has a replica on the
//    receiver's node (choosing only among those), then every read that has
//    none (choosing among all replicas). Each read takes the candidate that
//    has served the fewest reads so far in this layer, lowest slot on ties.
// 4. Batch each rank's reads by source rank and merge adjacent rows.
#include "layer_planner.h"

#include <algorithm>
#include <bit>
#include <string>

namespace eplb::plan_detail {

namespace {
std::string at_layer(int layer) { return "plan layer " + std::to_string(layer) + ": "; }
}  // namespace

LayerPlanner::LayerPlanner(const Topology& topology)
    : topology_(topology),
      slots_per_rank_(topology.slots_per_rank()),
      replica_begin_(size_t(topology.num_experts) + 1),
      replica_slots_(size_t(topology.num_slots)),
      cursor_(size_t(topology.num_experts)),
      local_epoch_(size_t(topology.num_experts), 0),
      local_slot_(size_t(topology.num_experts), -1),
      read_epoch_(size_t(topology.num_experts), 0),
      read_dest_(size_t(topology.num_experts), -1),
      node_mask_(size_t(topology.num_experts)),
      reads_served_(size_t(topology.num_slots)),
      served_bits_((size_t(topology.num_slots) + 63) / 64),
      read_from_count_(size_t(topology.num_ranks)),
      source_bits_((size_t(topology.num_ranks) + 63) / 64),
      bucket_head_(size_t(topology.num_ranks)),
      bucket_tail_(size_t(topology.num_ranks)),
      next_row_(size_t(topology.slots_per_rank())) {
  rank_of_slot_.resize(size_t(topology.num_slots));
  node_of_slot_.resize(size_t(topology.num_slots));
  node_of_rank_.resize(size_t(topology.num_ranks));
  for (int s = 0; s < topology.num_slots; ++s) {
    rank_of_slot_[size_t(s)] = topology.rank_of_slot(s);
    node_of_slot_[size_t(s)] = topology.node_of_slot(s);
  }
  for (int r = 0; r < topology.num_ranks; ++r) node_of_rank_[size_t(r)] = topology.node_of_rank(r);
  pending_.reserve(size_t(topology.num_slots));
  local_reads_.reserve(size_t(topology.num_slots));
  remote_reads_.reserve(size_t(topology.num_slots));
}

Status LayerPlanner::check_and_index(std::span<const int32_t> old_phy2log, std::span<const int32_t> new_phy2log,
                                     int layer) {
  const int num_slots = topology_.num_slots;
  const int num_experts = topology_.num_experts;
  if (old_phy2log.size() != size_t(num_slots) || new_phy2log.size() != size_t(num_slots))
    return error(Code::InvalidArgument, at_layer(layer) + "old phy2log has " + std::to_string(old_phy2log.size()) +
                                            " slots and new phy2log has " + std::to_string(new_phy2log.size()) +
                                            ", topology " + topology_.to_string() + " has " +
                                            std::to_string(num_slots));
  std::fill(replica_begin_.begin(), replica_begin_.end(), 0);
  for (int s = 0; s < num_slots; ++s) {
    int32_t e = old_phy2log[size_t(s)];
    if (e < 0 || e >= num_experts)
      return error(Code::InvalidArgument, at_layer(layer) + "old phy2log[" + std::to_string(s) + "] = " +
                                              std::to_string(e) + " is not an expert in [0, " +
                                              std::to_string(num_experts) + ")");
    ++replica_begin_[size_t(e) + 1];
  }
  for (int e = 0; e < num_experts; ++e) replica_begin_[size_t(e) + 1] += replica_begin_[size_t(e)];
  std::copy(replica_begin_.begin(), replica_begin_.end() - 1, cursor_.begin());
  std::fill(node_mask_.begin(), node_mask_.end(), 0);
  const bool use_node_mask = topology_.num_nodes <= 64;
  for (int s = 0; s < num_slots; ++s) {
    const size_t e = size_t(old_phy2log[size_t(s)]);
    replica_slots_[size_t(cursor_[e]++)] = s;
    if (use_node_mask) node_mask_[e] |= uint64_t(1) << node_of_slot_[size_t(s)];
  }

  for (int s = 0; s < num_slots; ++s) {
    int32_t e = new_phy2log[size_t(s)];
    if (e < 0 || e >= num_experts)
      return error(Code::InvalidArgument, at_layer(layer) + "new phy2log[" + std::to_string(s) + "] = " +
                                              std::to_string(e) + " is not an expert in [0, " +
                                              std::to_string(num_experts) + ")");
    if (replica_begin_[size_t(e)] == replica_begin_[size_t(e) + 1])
      return error(Code::InvalidArgument,
                   at_layer(layer) + "the new placement puts expert " + std::to_string(e) + " in slot " +
                       std::to_string(s) + " (rank " + std::to_string(topology_.rank_of_slot(s)) +
                       ") but no slot of the old placement holds it, so there is nothing to read it from");
  }
  return Status::ok();
}

bool LayerPlanner::has_replica_on_node(int32_t expert, int node) const {
  if (topology_.num_nodes <= 64) return (node_mask_[size_t(expert)] >> node) & 1;
  for (int32_t k = replica_begin_[size_t(expert)]; k < replica_begin_[size_t(expert) + 1]; ++k)
    if (node_of_slot_[size_t(replica_slots_[size_t(k)])] == node) return true;
  return false;
}

int32_t LayerPlanner::choose_source(int32_t expert, int node_filter) {
  int32_t best = -1;
  for (int32_t k = replica_begin_[size_t(expert)]; k < replica_begin_[size_t(expert) + 1]; ++k) {
    int32_t slot = replica_slots_[size_t(k)];
    if (node_filter >= 0 && node_of_slot_[size_t(slot)] != node_filter) continue;
    if (best < 0 || reads_served_[size_t(slot)] < reads_served_[size_t(best)]) best = slot;
  }
  // best >= 0: check_and_index guarantees a replica, has_replica_on_node one on the node.
  if (reads_served_[size_t(best)]++ == 0) {
    served_bits_[size_t(best) / 64] |= uint64_t(1) << (best % 64);
    ++read_from_count_[size_t(rank_of_slot_[size_t(best)])];
  }
  return best;
}

void LayerPlanner::batch_reads(RankLayerPlan& rank_plan, size_t begin, size_t end, PlanStats& stats) {
  // Bucket the rank's reads by source rank; within a bucket they stay in
  // ascending dest_slot order (pending_ is in slot order).
  size_t requests = 0;
  for (size_t i = begin; i < end; ++i) {
    const int32_t row = int32_t(i - begin);
    const int32_t source = rank_plan.slots[size_t(pending_[i].index)].source_rank;
    uint64_t& word = source_bits_[size_t(source) / 64];
    const uint64_t bit = uint64_t(1) << (source % 64);
    if (word & bit) {
      next_row_[size_t(bucket_tail_[size_t(source)])] = row;
    } else {
      word |= bit;
      bucket_head_[size_t(source)] = row;
      ++requests;
    }
    bucket_tail_[size_t(source)] = row;
    next_row_[size_t(row)] = -1;
  }
  rank_plan.reads.reserve(requests);
  int64_t descriptors = 0;
  // Source ranks in ascending order: the set bits, lowest first (clearing them).
  for (size_t w = 0; w < source_bits_.size(); ++w) {
    while (source_bits_[w] != 0) {
      const int source = int(w * 64) + std::countr_zero(source_bits_[w]);
      source_bits_[w] &= source_bits_[w] - 1;
      ReadRequest& request = rank_plan.reads.emplace_back();
      request.source_rank = source;
      for (int32_t row = bucket_head_[size_t(source)]; row >= 0; row = next_row_[size_t(row)]) {
        const SlotOp& op = rank_plan.slots[size_t(pending_[begin + size_t(row)].index)];
        if (!request.runs.empty()) {
          ReadRun& last = request.runs.back();
          if (last.source_slot + last.count == op.source_slot && last.dest_slot + last.count == op.slot) {
            ++last.count;
            continue;
          }
        }
        request.runs.push_back({op.source_slot, op.slot, 1});
      }
      descriptors += int64_t(request.runs.size());
    }
  }
  stats.requests += int64_t(requests);
  stats.descriptors += descriptors;
}

Result<LayerPlan> LayerPlanner::plan(std::span<const int32_t> old_phy2log, std::span<const int32_t> new_phy2log,
                                     int layer) {
  EPLB_TRY(check_and_index(old_phy2log, new_phy2log, layer));
  const int num_ranks = topology_.num_ranks;

  LayerPlan plan;
  plan.layer = layer;
  plan.ranks.resize(size_t(num_ranks));
  plan.slots_read_from.resize(size_t(num_ranks));
  PlanStats& stats = plan.stats;
  pending_.clear();
  local_reads_.clear();
  remote_reads_.clear();
  std::fill(reads_served_.begin(), reads_served_.end(), 0);
  std::fill(served_bits_.begin(), served_bits_.end(), 0);
  std::fill(read_from_count_.begin(), read_from_count_.end(), 0);

  // Classify every slot.
  for (int r = 0; r < num_ranks; ++r) {
    ++epoch_;
    const int base = r * slots_per_rank_;
    const int node = node_of_rank_[size_t(r)];
    for (int s = base + slots_per_rank_ - 1; s >= base; --s) {  // downwards: the lowest slot wins
      int32_t e = old_phy2log[size_t(s)];
      local_epoch_[size_t(e)] = epoch_;
      local_slot_[size_t(e)] = s;
    }
    RankLayerPlan& rank_plan = plan.ranks[size_t(r)];
    rank_plan.rank = r;
    rank_plan.slots.resize(size_t(slots_per_rank_));
    for (int i = 0; i < slots_per_rank_; ++i) {
      const int s = base + i;
      const int32_t e = new_phy2log[size_t(s)];
      SlotOp& op = rank_plan.slots[size_t(i)];
      op.slot = s;
      op.expert = e;
      if (old_phy2log[size_t(s)] == e) {
        op.action = SlotAction::Keep;
        ++stats.slots_kept;
      } else if (local_epoch_[size_t(e)] == epoch_) {
        op.action = SlotAction::LocalCopy;
        op.source_rank = r;
        op.source_slot = local_slot_[size_t(e)];
        ++stats.slots_local_copy;
      } else if (read_epoch_[size_t(e)] == epoch_) {
        op.action = SlotAction::LocalCopy;
        op.source_rank = r;
        op.source_slot = read_dest_[size_t(e)];
        op.copy_after_read = true;
        ++stats.slots_local_copy;
      } else {
        op.action = SlotAction::RemoteRead;
        read_epoch_[size_t(e)] = epoch_;
        read_dest_[size_t(e)] = s;
        (has_replica_on_node(e, node) ? local_reads_ : remote_reads_).push_back(int32_t(pending_.size()));
        pending_.push_back({r, i, e});
      }
    }
  }

  // Sources: node-local reads first (each node's replicas serve only that
  // node's receivers in this pass), then cross-node reads over all replicas.
  for (int32_t index : local_reads_) {
    const PendingRead& read = pending_[size_t(index)];
    const int32_t source = choose_source(read.expert, node_of_rank_[size_t(read.rank)]);
    SlotOp& op = plan.ranks[size_t(read.rank)].slots[size_t(read.index)];
    op.source_slot = source;
    op.source_rank = rank_of_slot_[size_t(source)];
  }
  for (int32_t index : remote_reads_) {
    const PendingRead& read = pending_[size_t(index)];
    const int32_t source = choose_source(read.expert, -1);
    SlotOp& op = plan.ranks[size_t(read.rank)].slots[size_t(read.index)];
    op.source_slot = source;
    op.source_rank = rank_of_slot_[size_t(source)];
  }
  stats.slots_read_intra_node = int64_t(local_reads_.size());
  stats.slots_read_inter_node = int64_t(remote_reads_.size());

  // Batch per receiving rank (pending_ is ordered by rank, then slot).
  for (size_t i = 0; i < pending_.size();) {
    size_t j = i;
    while (j < pending_.size() && pending_[j].rank == pending_[i].rank) ++j;
    batch_reads(plan.ranks[size_t(pending_[i].rank)], i, j, stats);
    i = j;
  }

  // What every rank must keep stable for its readers, by ascending slot.
  for (int r = 0; r < num_ranks; ++r) plan.slots_read_from[size_t(r)].reserve(size_t(read_from_count_[size_t(r)]));
  for (size_t w = 0; w < served_bits_.size(); ++w)
    for (uint64_t bits = served_bits_[w]; bits != 0; bits &= bits - 1) {
      const int s = int(w * 64) + std::countr_zero(bits);
      plan.slots_read_from[size_t(rank_of_slot_[size_t(s)])].push_back(s);
    }
  return plan;
}

}  // namespace eplb::plan_detail
