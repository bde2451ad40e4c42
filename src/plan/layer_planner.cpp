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
  pending_.resize(size_t(topology.num_slots));
  local_reads_.resize(size_t(topology.num_slots));
  remote_reads_.resize(size_t(topology.num_slots));
  rank_reads_begin_.resize(size_t(topology.num_ranks) + 1);
}

Status LayerPlanner::check_sizes(std::span<const int32_t> old_phy2log, std::span<const int32_t> new_phy2log,
                                 int layer) const {
  const int num_slots = topology_.num_slots;
  if (old_phy2log.size() != size_t(num_slots) || new_phy2log.size() != size_t(num_slots))
    return error(Code::InvalidArgument, at_layer(layer) + "old phy2log has " + std::to_string(old_phy2log.size()) +
                                            " slots and new phy2log has " + std::to_string(new_phy2log.size()) +
                                            ", topology " + topology_.to_string() + " has " +
                                            std::to_string(num_slots));
  return Status::ok();
}

Status LayerPlanner::not_an_expert(const char* which, int slot, int32_t expert, int layer) const {
  return error(Code::InvalidArgument, at_layer(layer) + which + " phy2log[" + std::to_string(slot) + "] = " +
                                          std::to_string(expert) + " is not an expert in [0, " +
                                          std::to_string(topology_.num_experts) + ")");
}

// The old replicas of every expert by ascending slot (CSR), and the nodes
// holding each expert; checks the old mapping on the way.
Status LayerPlanner::index_old(std::span<const int32_t> old_phy2log, int layer) {
  const int num_slots = topology_.num_slots;
  const uint32_t num_experts = uint32_t(topology_.num_experts);
  std::fill(replica_begin_.begin(), replica_begin_.end(), 0);
  for (int s = 0; s < num_slots; ++s) {
    const int32_t e = old_phy2log[size_t(s)];
    if (uint32_t(e) >= num_experts) return not_an_expert("old", s, e, layer);
    ++replica_begin_[size_t(e) + 1];
  }
  for (size_t e = 0; e + 1 < replica_begin_.size(); ++e) replica_begin_[e + 1] += replica_begin_[e];
  std::copy(replica_begin_.begin(), replica_begin_.end() - 1, cursor_.begin());
  std::fill(node_mask_.begin(), node_mask_.end(), 0);
  const bool use_node_mask = topology_.num_nodes <= 64;
  for (int s = 0; s < num_slots; ++s) {
    const size_t e = size_t(old_phy2log[size_t(s)]);
    replica_slots_[size_t(cursor_[e]++)] = s;
    if (use_node_mask) node_mask_[e] |= uint64_t(1) << node_of_slot_[size_t(s)];
  }
  return Status::ok();
}

// Every expert of the new mapping is an expert and has an old replica.
Status LayerPlanner::check_new(std::span<const int32_t> new_phy2log, int layer) const {
  const uint32_t num_experts = uint32_t(topology_.num_experts);
  for (int s = 0; s < topology_.num_slots; ++s) {
    const int32_t e = new_phy2log[size_t(s)];
    if (uint32_t(e) >= num_experts) return not_an_expert("new", s, e, layer);
    if (replica_begin_[size_t(e)] == replica_begin_[size_t(e) + 1])
      return error(Code::InvalidArgument,
                   at_layer(layer) + "the new placement puts expert " + std::to_string(e) + " in slot " +
                       std::to_string(s) + " (rank " + std::to_string(topology_.rank_of_slot(s)) +
                       ") but no slot of the old placement holds it, so there is nothing to read it from");
  }
  return Status::ok();
}

void LayerPlanner::start_layer(LayerPlan& plan, int layer) {
  const int num_ranks = topology_.num_ranks;
  plan.layer = layer;
  plan.ranks.resize(size_t(num_ranks));
  plan.slots_read_from.resize(size_t(num_ranks));
  plan.slot_storage.resize(size_t(topology_.num_slots));
  num_pending_ = num_local_reads_ = num_remote_reads_ = 0;
  std::fill(reads_served_.begin(), reads_served_.end(), 0);
}

// Step 2 for one rank: writes its slots' ops into plan.slot_storage and
// appends its reads to pending_ (in slot order).
void LayerPlanner::classify_rank(int rank, std::span<const int32_t> old_phy2log,
                                 std::span<const int32_t> new_phy2log, LayerPlan& plan) {
  ++epoch_;
  const int base = rank * slots_per_rank_;
  const int node = node_of_rank_[size_t(rank)];
  for (int s = base + slots_per_rank_ - 1; s >= base; --s) {  // downwards: the lowest slot wins
    const size_t e = size_t(old_phy2log[size_t(s)]);
    local_epoch_[e] = epoch_;
    local_slot_[e] = s;
  }
  rank_reads_begin_[size_t(rank)] = num_pending_;
  PlanStats& stats = plan.stats;
  SlotOp* ops = plan.slot_storage.data();
  for (int i = 0; i < slots_per_rank_; ++i) {
    const int s = base + i;
    const int32_t e = new_phy2log[size_t(s)];
    if (old_phy2log[size_t(s)] == e) {
      ops[s] = {s, e, SlotAction::Keep, -1, -1, false};
      ++stats.slots_kept;
    } else if (local_epoch_[size_t(e)] == epoch_) {
      ops[s] = {s, e, SlotAction::LocalCopy, rank, local_slot_[size_t(e)], false};
      ++stats.slots_local_copy;
    } else if (read_epoch_[size_t(e)] == epoch_) {
      ops[s] = {s, e, SlotAction::LocalCopy, rank, read_dest_[size_t(e)], true};
      ++stats.slots_local_copy;
    } else {
      ops[s] = {s, e, SlotAction::RemoteRead, -1, -1, false};  // the source: choose_sources
      read_epoch_[size_t(e)] = epoch_;
      read_dest_[size_t(e)] = s;
      if (has_replica_on_node(e, node))
        local_reads_[size_t(num_local_reads_++)] = num_pending_;
      else
        remote_reads_[size_t(num_remote_reads_++)] = num_pending_;
      pending_[size_t(num_pending_++)] = {rank, i, e};
    }
  }
  rank_reads_begin_[size_t(rank) + 1] = num_pending_;
}

bool LayerPlanner::has_replica_on_node(int32_t expert, int node) const {
  if (topology_.num_nodes <= 64) return (node_mask_[size_t(expert)] >> node) & 1;
  for (int32_t k = replica_begin_[size_t(expert)]; k < replica_begin_[size_t(expert) + 1]; ++k)
    if (node_of_slot_[size_t(replica_slots_[size_t(k)])] == node) return true;
  return false;
}

// The candidate replica (old slots first .. end of replica_slots_) that has
// served the fewest reads so far, lowest slot on ties; with node_filter >= 0
// only replicas on that node (has_replica_on_node promised one).
int32_t LayerPlanner::least_served(int32_t first, int32_t end, int node_filter) const {
  int32_t best = -1;
  for (int32_t k = first; k < end; ++k) {
    const int32_t slot = replica_slots_[size_t(k)];
    if (node_filter >= 0 && node_of_slot_[size_t(slot)] != node_filter) continue;
    if (best < 0 || reads_served_[size_t(slot)] < reads_served_[size_t(best)]) best = slot;
  }
  return best;
}

// Step 3: node-local reads first (each node's replicas serve only that
// node's receivers in this pass), then cross-node reads over all replicas.
void LayerPlanner::choose_sources(LayerPlan& plan) {
  for (const bool node_local : {true, false}) {
    const int32_t* reads = node_local ? local_reads_.data() : remote_reads_.data();
    const int32_t count = node_local ? num_local_reads_ : num_remote_reads_;
    for (int32_t k = 0; k < count; ++k) {
      PendingRead& read = pending_[size_t(reads[k])];
      const int32_t first = replica_begin_[size_t(read.expert)], end = replica_begin_[size_t(read.expert) + 1];
      // One replica (the common case) is the only candidate; check_new promised one.
      const int32_t source = end - first == 1 ? replica_slots_[size_t(first)]
                                              : least_served(first, end, node_local ? node_of_rank_[size_t(read.rank)] : -1);
      ++reads_served_[size_t(source)];
      read.source_slot = source;
      read.source_rank = rank_of_slot_[size_t(source)];
      SlotOp& op = plan.slot_storage[size_t(read.rank * slots_per_rank_ + read.index)];
      op.source_slot = source;
      op.source_rank = read.source_rank;
    }
  }
  plan.stats.slots_read_intra_node = int64_t(num_local_reads_);
  plan.stats.slots_read_inter_node = int64_t(num_remote_reads_);
}

// Step 4 for one rank (pending_[begin, end)): one request per source rank,
// in ascending source rank, appended to plan.read_storage; rows stay in
// ascending dest_slot order inside a request.
void LayerPlanner::batch_reads(int rank, size_t begin, size_t end, LayerPlan& plan) {
  const PendingRead* reads = pending_.data() + begin;
  const int32_t first_slot = rank * slots_per_rank_;
  for (int32_t row = 0; row < int32_t(end - begin); ++row) {  // bucket the rows by source rank
    const int32_t source = reads[row].source_rank;
    uint64_t& word = source_bits_[size_t(source) / 64];
    const uint64_t bit = uint64_t(1) << (source % 64);
    if (word & bit)
      next_row_[size_t(bucket_tail_[size_t(source)])] = row;
    else
      bucket_head_[size_t(source)] = row;
    word |= bit;
    bucket_tail_[size_t(source)] = row;
    next_row_[size_t(row)] = -1;
  }
  int64_t descriptors = 0;
  for (size_t w = 0; w < source_bits_.size(); ++w)
    for (; source_bits_[w] != 0; source_bits_[w] &= source_bits_[w] - 1) {  // lowest source rank first
      const int source = int(w * 64) + std::countr_zero(source_bits_[w]);
      ReadRequest& request = plan.read_storage.emplace_back();
      request.source_rank = source;
      int32_t row = bucket_head_[size_t(source)];
      ReadRun run{reads[row].source_slot, first_slot + reads[row].index, 1};
      for (row = next_row_[size_t(row)]; row >= 0; row = next_row_[size_t(row)]) {
        const int32_t source_slot = reads[row].source_slot, dest_slot = first_slot + reads[row].index;
        if (run.source_slot + run.count == source_slot && run.dest_slot + run.count == dest_slot) {
          ++run.count;
        } else {
          request.runs.push_back(run);
          ++descriptors;
          run = {source_slot, dest_slot, 1};
        }
      }
      request.runs.push_back(run);
      ++descriptors;
    }
  plan.stats.descriptors += descriptors;
}

void LayerPlanner::batch_all_reads(LayerPlan& plan) {
  plan.read_storage.reserve(size_t(num_pending_));  // at most one request per read: no reallocation below
  for (int r = 0; r < topology_.num_ranks; ++r) {
    const size_t i = size_t(rank_reads_begin_[size_t(r)]), j = size_t(rank_reads_begin_[size_t(r) + 1]);
    const size_t first_request = plan.read_storage.size();
    if (j > i) batch_reads(r, i, j, plan);
    RankLayerPlan& rank_plan = plan.ranks[size_t(r)];
    rank_plan.rank = r;
    rank_plan.slots = {plan.slot_storage.data() + size_t(r) * size_t(slots_per_rank_), size_t(slots_per_rank_)};
    rank_plan.reads = {plan.read_storage.data() + first_request, plan.read_storage.size() - first_request};
  }
  plan.stats.requests = int64_t(plan.read_storage.size());
}

// What every rank must keep stable for its readers: the old slots that
// served a read, ascending (slots are rank-major, so each rank's run is
// contiguous).
void LayerPlanner::list_read_from(LayerPlan& plan) {
  const int num_slots = topology_.num_slots;
  std::vector<int>& served = plan.read_from_storage;
  served.resize(size_t(num_slots));
  size_t count = 0;
  for (int s = 0; s < num_slots; ++s) {  // branch-free: write every slot, keep the served ones
    served[count] = s;
    count += reads_served_[size_t(s)] > 0;
  }
  served.resize(count);
  const int* first = served.data();
  const int* end = first + count;
  for (int r = 0; r < topology_.num_ranks; ++r) {
    const int* next = first;
    while (next != end && *next < (r + 1) * slots_per_rank_) ++next;
    plan.slots_read_from[size_t(r)] = std::span<const int>(first, size_t(next - first));
    first = next;
  }
}

Result<LayerPlan> LayerPlanner::plan(std::span<const int32_t> old_phy2log, std::span<const int32_t> new_phy2log,
                                     int layer) {
  EPLB_TRY(check_sizes(old_phy2log, new_phy2log, layer));
  EPLB_TRY(index_old(old_phy2log, layer));
  EPLB_TRY(check_new(new_phy2log, layer));
  LayerPlan plan;
  start_layer(plan, layer);
  for (int r = 0; r < topology_.num_ranks; ++r) classify_rank(r, old_phy2log, new_phy2log, plan);
  choose_sources(plan);
  batch_all_reads(plan);
  list_read_from(plan);
  return plan;
}

}  // namespace eplb::plan_detail
