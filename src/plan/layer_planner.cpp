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
#include <string>

namespace eplb::plan_detail {

namespace {
std::string at_layer(int layer) { return "plan layer " + std::to_string(layer) + ": "; }
}  // namespace

LayerPlanner::LayerPlanner(const Topology& topology)
    : topology_(topology),
      slots_per_rank_(topology.slots_per_rank()),
      slots_per_node_(topology.slots_per_rank() * topology.ranks_per_node()),
      replica_begin_(size_t(topology.num_experts) + 1),
      replica_slots_(size_t(topology.num_slots)),
      cursor_(size_t(topology.num_experts)),
      local_epoch_(size_t(topology.num_experts), 0),
      local_slot_(size_t(topology.num_experts), -1),
      read_epoch_(size_t(topology.num_experts), 0),
      read_dest_(size_t(topology.num_experts), -1),
      reads_served_(size_t(topology.num_slots)),
      per_rank_count_(size_t(topology.num_ranks)) {
  pending_.reserve(size_t(topology.num_slots));
  rows_.reserve(size_t(slots_per_rank_));
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
  for (int s = 0; s < num_slots; ++s) replica_slots_[size_t(cursor_[size_t(old_phy2log[size_t(s)])]++)] = s;

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

int32_t LayerPlanner::choose_source(int32_t expert, int node_filter) {
  int32_t best = -1;
  for (int32_t k = replica_begin_[size_t(expert)]; k < replica_begin_[size_t(expert) + 1]; ++k) {
    int32_t slot = replica_slots_[size_t(k)];
    if (node_filter >= 0 && slot / slots_per_node_ != node_filter) continue;
    if (best < 0 || reads_served_[size_t(slot)] < reads_served_[size_t(best)]) best = slot;
  }
  ++reads_served_[size_t(best)];  // best >= 0: check_and_index guarantees a replica, node_filter one on the node
  return best;
}

void LayerPlanner::batch_reads(RankLayerPlan& rank_plan, size_t begin, size_t end, PlanStats& stats) {
  rows_.clear();
  for (size_t i = begin; i < end; ++i) {
    const SlotOp& op = rank_plan.slots[size_t(pending_[i].index)];
    rows_.push_back({op.source_rank, op.source_slot, op.slot});
  }
  // Keys are unique (one read per destination slot): no stability needed.
  std::sort(rows_.begin(), rows_.end(), [](const Row& a, const Row& b) {
    return a.source_rank != b.source_rank ? a.source_rank < b.source_rank : a.dest_slot < b.dest_slot;
  });
  size_t requests = 0;
  for (size_t i = 0; i < rows_.size(); ++i)
    if (i == 0 || rows_[i].source_rank != rows_[i - 1].source_rank) ++requests;
  rank_plan.reads.reserve(requests);
  for (size_t i = 0; i < rows_.size();) {
    size_t j = i;
    while (j < rows_.size() && rows_[j].source_rank == rows_[i].source_rank) ++j;
    // Count the runs of this request first so its vector is allocated once.
    size_t runs = 1;
    for (size_t k = i + 1; k < j; ++k)
      if (rows_[k].source_slot != rows_[k - 1].source_slot + 1 || rows_[k].dest_slot != rows_[k - 1].dest_slot + 1)
        ++runs;
    ReadRequest& request = rank_plan.reads.emplace_back();
    request.source_rank = rows_[i].source_rank;
    request.runs.reserve(runs);
    for (size_t k = i; k < j; ++k) {
      if (k > i && rows_[k].source_slot == rows_[k - 1].source_slot + 1 &&
          rows_[k].dest_slot == rows_[k - 1].dest_slot + 1) {
        ++request.runs.back().count;
      } else {
        request.runs.push_back({rows_[k].source_slot, rows_[k].dest_slot, 1});
      }
    }
    stats.descriptors += int64_t(runs);
    i = j;
  }
  stats.requests += int64_t(requests);
}

Result<LayerPlan> LayerPlanner::plan(std::span<const int32_t> old_phy2log, std::span<const int32_t> new_phy2log,
                                     int layer) {
  EPLB_TRY(check_and_index(old_phy2log, new_phy2log, layer));
  const int num_ranks = topology_.num_ranks;
  const int num_slots = topology_.num_slots;
  const int ranks_per_node = topology_.ranks_per_node();

  LayerPlan plan;
  plan.layer = layer;
  plan.ranks.resize(size_t(num_ranks));
  plan.slots_read_from.resize(size_t(num_ranks));
  PlanStats& stats = plan.stats;
  pending_.clear();
  std::fill(reads_served_.begin(), reads_served_.end(), 0);

  // Classify every slot.
  for (int r = 0; r < num_ranks; ++r) {
    ++epoch_;
    const int base = r * slots_per_rank_;
    const int node = r / ranks_per_node;
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
        bool node_local = false;
        for (int32_t k = replica_begin_[size_t(e)]; k < replica_begin_[size_t(e) + 1] && !node_local; ++k)
          node_local = replica_slots_[size_t(k)] / slots_per_node_ == node;
        pending_.push_back({r, i, e, node_local});
      }
    }
  }

  // Sources: node-local reads first (each node's replicas serve only that
  // node's receivers in this pass), then cross-node reads over all replicas.
  for (int pass = 0; pass < 2; ++pass) {
    const bool node_local_pass = pass == 0;
    for (const PendingRead& read : pending_) {
      if (read.node_local != node_local_pass) continue;
      const int32_t source = choose_source(read.expert, node_local_pass ? read.rank / ranks_per_node : -1);
      SlotOp& op = plan.ranks[size_t(read.rank)].slots[size_t(read.index)];
      op.source_slot = source;
      op.source_rank = topology_.rank_of_slot(source);
      if (source / slots_per_node_ == read.rank / ranks_per_node)
        ++stats.slots_read_intra_node;
      else
        ++stats.slots_read_inter_node;
    }
  }

  // Batch per receiving rank (pending_ is ordered by rank, then slot).
  for (size_t i = 0; i < pending_.size();) {
    size_t j = i;
    while (j < pending_.size() && pending_[j].rank == pending_[i].rank) ++j;
    batch_reads(plan.ranks[size_t(pending_[i].rank)], i, j, stats);
    i = j;
  }

  // What every rank must keep stable for its readers, by ascending slot.
  std::fill(per_rank_count_.begin(), per_rank_count_.end(), 0);
  for (int s = 0; s < num_slots; ++s)
    if (reads_served_[size_t(s)] > 0) ++per_rank_count_[size_t(s / slots_per_rank_)];
  for (int r = 0; r < num_ranks; ++r) plan.slots_read_from[size_t(r)].reserve(size_t(per_rank_count_[size_t(r)]));
  for (int s = 0; s < num_slots; ++s)
    if (reads_served_[size_t(s)] > 0) plan.slots_read_from[size_t(s / slots_per_rank_)].push_back(s);
  return plan;
}

}  // namespace eplb::plan_detail
