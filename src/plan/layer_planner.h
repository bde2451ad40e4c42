// src/plan/layer_planner.h - the planner's working memory, sized once per
// topology and reused for every layer, so planning a layer allocates only
// the result it returns (no per-slot heap allocations).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "eplb/placement.h"
#include "eplb/plan.h"
#include "eplb/status.h"

namespace eplb::plan_detail {

class LayerPlanner {
 public:
  // `topology` must already be valid (Topology::validate()).
  explicit LayerPlanner(const Topology& topology);

  // Checks both mappings (size, expert range, every needed expert exists in
  // the old mapping) and plans the layer; see eplb/plan.h for the rules.
  Result<LayerPlan> plan(std::span<const int32_t> old_phy2log, std::span<const int32_t> new_phy2log, int layer);

 private:
  // One RemoteRead whose source is still to be chosen.
  struct PendingRead {
    int32_t rank;   // receiving rank
    int32_t index;  // index of the slot within the rank (into RankLayerPlan::slots)
    int32_t expert;
    int32_t source_rank = -1, source_slot = -1;  // chosen by choose_sources (copied into the op)
  };

  Status check_sizes(std::span<const int32_t> old_phy2log, std::span<const int32_t> new_phy2log, int layer) const;
  Status not_an_expert(const char* which, int slot, int32_t expert, int layer) const;
  Status index_old(std::span<const int32_t> old_phy2log, int layer);
  Status check_new(std::span<const int32_t> new_phy2log, int layer) const;
  void start_layer(LayerPlan& plan, int layer);
  void classify_rank(int rank, std::span<const int32_t> old_phy2log, std::span<const int32_t> new_phy2log,
                     LayerPlan& plan);
  bool has_replica_on_node(int32_t expert, int node) const;
  int32_t least_served(int32_t first, int32_t end, int node_filter) const;
  void choose_sources(LayerPlan& plan);
  void batch_reads(int rank, size_t begin, size_t end, LayerPlan& plan);
  void batch_all_reads(LayerPlan& plan);
  void list_read_from(LayerPlan& plan);

  Topology topology_;
  int slots_per_rank_ = 0;

  std::vector<int32_t> rank_of_slot_;  // [R] (tables: no division in the loops)
  std::vector<int32_t> node_of_slot_;  // [R]
  std::vector<int32_t> node_of_rank_;  // [P]

  // Old replicas of every expert, by ascending slot (CSR: replica_begin_[e] ..
  // replica_begin_[e + 1] index into replica_slots_).
  std::vector<int32_t> replica_begin_;  // [E + 1]
  std::vector<int32_t> replica_slots_;  // [R]
  std::vector<int32_t> cursor_;         // [E] fill cursor while building the CSR

  // Per receiving rank, stamped with epoch_ so nothing is cleared between ranks.
  uint64_t epoch_ = 0;
  std::vector<uint64_t> local_epoch_;  // [E] expert held by this rank in the old placement...
  std::vector<int32_t> local_slot_;    // [E] ...in this (lowest) slot
  std::vector<uint64_t> read_epoch_;   // [E] expert read by this rank in this layer...
  std::vector<int32_t> read_dest_;     // [E] ...into this slot

  // Nodes holding an old replica of each expert, as a bit mask (when N <= 64;
  // otherwise node-locality is found by scanning the replicas).
  std::vector<uint64_t> node_mask_;  // [E]

  std::vector<int32_t> reads_served_;  // [R] reads served so far by each old slot
  std::vector<PendingRead> pending_;   // [R] every read, by (rank, slot): the first num_pending_
  std::vector<int32_t> local_reads_;   // [R] indices into pending_ with a replica on the receiver's node
  std::vector<int32_t> remote_reads_;  // [R] indices into pending_ without
  std::vector<int32_t> rank_reads_begin_;  // [P + 1] each rank's first read in pending_
  int32_t num_pending_ = 0, num_local_reads_ = 0, num_remote_reads_ = 0;

  std::vector<uint64_t> source_bits_;  // [P / 64] source ranks seen
  std::vector<int32_t> bucket_head_;   // [P] first row from each source rank
  std::vector<int32_t> bucket_tail_;   // [P] last row from each source rank
  std::vector<int32_t> next_row_;      // [slots per rank] next row from the same source rank
};

}  // namespace eplb::plan_detail
