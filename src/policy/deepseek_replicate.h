// deepseek_replicate.h - DeepSeek's replication of experts inside a node,
// over caller-owned buffers (internal to src/policy/).
//
// The published rule, in float32: each redundant replica goes to the expert
// with the largest float32(weight / count) (equal: lower expert index).
// The experts that receive redundant replicas are always a prefix of the
// experts sorted by (weight desc, index): an expert is first chosen when its
// key is the best of all, so every expert ahead of it was chosen before. The
// hottest expert is therefore the better of the head of the unreplicated
// suffix and the minimum of a tournament tree over the prefix.
#pragma once

#include <cstdint>
#include <vector>

#include "deepseek_keys.h"

namespace eplb::deepseek_detail {

// Replicates a batch of independent nodes of one shape (num_experts experts
// into num_physical replicas each), one replica of every node per step so
// that their dependency chains overlap.
class BatchReplicator {
 public:
  struct Job {
    const uint64_t* sorted;   // [E + 1] descending_key(weight[j], j) of every expert, ascending
                              // (sorted[E] is read, never used)
    const float* weight;      // [E]
    int32_t* phy2expert;      // [R] replica p < E is expert p; p >= E the p-th redundant one
    int32_t* replica_rank;    // [R] 0 for an expert's first copy, k for its k-th extra
    int32_t* count;           // [E]
    uint64_t* packing_order;  // [R] descending keys (weight / count, replica index), ascending
  };
  void run(const Job* jobs, int num_jobs, int num_experts, int num_physical);

  // One job's state as the interleaved loop reads it.
  struct State {
    Job job;
    uint64_t* tree;    // over the experts replicated so far, by the order they were first chosen
    int32_t* leaf_of;  // expert -> its leaf
    int prefix;        // experts replicated so far: sorted[0, prefix)
  };

 private:
  void collect_replicated(State& state, int b, int num_experts, int num_physical);
  void merge(const State& state, int b, int num_experts, int num_physical);

  std::vector<uint64_t> tree_;
  std::vector<int32_t> leaf_of_;
  std::vector<State> states_;
  std::vector<uint64_t> replicated_, spare_;
  int leaves_ = 0;                  // of every job's tree
  std::vector<uint64_t> run_keys_;  // the replicated experts' keys, sorted
  std::vector<int32_t> run_of_leaf_, run_next_;  // per leaf: its run of equal values; per run: next extra's place
};

}  // namespace eplb::deepseek_detail
