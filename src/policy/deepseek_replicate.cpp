// deepseek_replicate.cpp - DeepSeek's replication, interleaved over a batch
// of nodes, and each node's packing order.
#include "deepseek_replicate.h"

#include <algorithm>

namespace eplb::deepseek_detail {

namespace {

template <int kLeaves>
void replicate_interleaved(BatchReplicator::State* states, int num_jobs, int num_experts, int num_physical,
                           int run_leaves) {
  const int leaves = kLeaves > 0 ? kLeaves : run_leaves;
  for (int p = num_experts; p < num_physical; ++p)
    for (int b = 0; b < num_jobs; ++b) {  // independent chains, interleaved
      BatchReplicator::State& st = states[b];
      const BatchReplicator::Job& job = st.job;
      const uint64_t head = st.prefix < num_experts ? job.sorted[st.prefix] : kNever;
      int32_t expert, leaf;
      if (head < st.tree[1]) {  // the hottest expert has no extra replica yet
        expert = index_of(head);
        leaf = st.prefix++;
        st.leaf_of[expert] = leaf;
      } else {
        expert = index_of(st.tree[1]);
        leaf = st.leaf_of[expert];
      }
      const int32_t count = ++job.count[expert];
      job.phy2expert[p] = expert;
      job.replica_rank[p] = count - 1;
      update_path<kLeaves>(st.tree, leaves, leaf, descending_key(job.weight[expert] / float(count), expert));
    }
}

}  // namespace

void BatchReplicator::run(const Job* jobs, int num_jobs, int num_experts, int num_physical) {
  const int extras = num_physical - num_experts;
  const int leaves = leaves_for(std::max(1, std::min(num_experts, extras)));
  tree_.assign(size_t(2 * leaves) * size_t(num_jobs), kNever);
  leaf_of_.resize(size_t(num_experts) * size_t(num_jobs));
  states_.resize(size_t(num_jobs));
  for (int b = 0; b < num_jobs; ++b) {
    const Job& job = jobs[b];
    for (int j = 0; j < num_experts; ++j) {
      job.phy2expert[j] = j;
      job.replica_rank[j] = 0;
      job.count[j] = 1;
    }
    states_[size_t(b)] = {job, tree_.data() + size_t(2 * leaves) * size_t(b),
                          leaf_of_.data() + size_t(num_experts) * size_t(b), 0};
  }
  if (extras > 0)
    dispatch_leaves(leaves, [&](auto fixed) {
      replicate_interleaved<decltype(fixed)::value>(states_.data(), num_jobs, num_experts, num_physical, leaves);
    });
  replicated_.resize(size_t(num_physical + 1) * size_t(num_jobs));
  leaves_ = leaves;
  run_keys_.resize(size_t(leaves));
  run_of_leaf_.resize(size_t(leaves));
  run_next_.resize(size_t(leaves));
  for (int b = 0; b < num_jobs; ++b) {
    collect_replicated(states_[size_t(b)], b, num_experts, num_physical);
    merge(states_[size_t(b)], b, num_experts, num_physical);
  }
}

// Every replica of a replicated expert carries float32(weight / count),
// the key its leaf holds at the end. The replicated experts' leaf keys are
// sorted; each run of equal values then takes its experts' first copies
// (index = expert < num_experts, ascending in the sorted keys) followed by
// their extras in ascending replica index, which one scan of the extras
// writes: the order a sort of every replica's (value, index) key gives.
// A kNever sentinel ends the list; merge() takes it from there with the
// unreplicated suffix of `sorted`, which keeps its keys (weight / 1 is
// exact, replica index == expert index).
void BatchReplicator::collect_replicated(State& state, int b, int num_experts, int num_physical) {
  const Job& job = state.job;
  uint64_t* out = replicated_.data() + size_t(num_physical + 1) * size_t(b);
  const int distinct = state.prefix;
  uint64_t* experts = run_keys_.data();
  for (int leaf = 0; leaf < distinct; ++leaf) experts[leaf] = state.tree[leaves_ + leaf];
  // Whole keys: leaves are in first-chosen order, not index order, so
  // sort_keys' stable sort by value alone would misplace equal values.
  sort_whole_keys(experts, distinct);
  int n = 0, runs = 0;
  for (int k = 0; k < distinct;) {  // one run of equal values
    const uint64_t value = experts[k] >> 32;
    int extras = 0;
    for (; k < distinct && experts[k] >> 32 == value; ++k) {
      const int32_t expert = index_of(experts[k]);
      out[n++] = experts[k];
      run_of_leaf_[size_t(state.leaf_of[expert])] = runs;
      extras += job.count[expert] - 1;
    }
    run_next_[size_t(runs++)] = n;
    n += extras;
  }
  for (int p = num_experts; p < num_physical; ++p) {
    const int32_t expert = job.phy2expert[p];
    const int32_t leaf = state.leaf_of[expert];
    out[run_next_[size_t(run_of_leaf_[size_t(leaf)])]++] = (state.tree[leaves_ + leaf] & ~uint64_t(0xffffffffu)) |
                                                           uint32_t(p);
  }
  out[n] = kNever;
}

// Merges the sorted replicated keys (ending in the kNever sentinel) with
// the unreplicated suffix of `sorted`. (GCC compiles the choice to a
// branch, which predicts well here: a mask-and-select version, whose next
// loads wait for the comparison, measured 15% slower over the whole policy.)
// Reads job.sorted[num_experts] once the suffix is exhausted: the caller's
// buffer holds one key more.
void BatchReplicator::merge(const State& state, int b, int num_experts, int num_physical) {
  const uint64_t* replicated = replicated_.data() + size_t(num_physical + 1) * size_t(b);
  const uint64_t* sorted = state.job.sorted;
  uint64_t* out = state.job.packing_order;
  int i = 0, j = state.prefix;
  for (int k = 0; k < num_physical; ++k) {
    const uint64_t a = replicated[i], suffix = sorted[j];
    const bool take_a = (j == num_experts) | (a < suffix);
    out[k] = take_a ? a : suffix;
    i += take_a;
    j += !take_a;
  }
}

}  // namespace eplb::deepseek_detail
