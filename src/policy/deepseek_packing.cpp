// deepseek_packing.cpp - DeepSeek's balanced packing, interleaved over a
// batch of independent problems.
#include "deepseek_packing.h"

#include <bit>

namespace eplb::deepseek_detail {

namespace {

// A pack's tree key: its float32 load in the high half (a sum from +0 is
// never -0), then pack << fill_bits | the items it holds. Equal loads order
// by pack index as the rule asks (two keys never share a pack), and the
// minimum key alone gives the lightest pack, its load and its fill.
inline uint64_t pack_key(float load, uint32_t pack, int fill_bits, uint32_t filled) {
  return (uint64_t(std::bit_cast<uint32_t>(load)) << 32) | (pack << fill_bits) | filled;
}

// One greedy step of every job per round: the jobs' dependency chains
// (find the lightest pack, add to it, update its tree) overlap. kLeaves > 0
// fixes the tree size at compile time so the path update is unrolled.
template <int kLeaves>
void pack_interleaved(const BatchPacker::State* states, int num_jobs, int first_step, int num_items, int per_pack,
                      int fill_bits, int run_leaves) {
  const int leaves = kLeaves > 0 ? kLeaves : run_leaves;
  const uint32_t fill_mask = (uint32_t(1) << fill_bits) - 1;
  for (int step = first_step; step < num_items; ++step)
    for (int b = 0; b < num_jobs; ++b) {  // independent chains, interleaved
      const BatchPacker::State st = states[b];
      const uint64_t key = st.items[step];
      const uint64_t lightest = st.tree[1];  // lightest non-full pack, lowest index
      const uint32_t pack = uint32_t(lightest) >> fill_bits, rank = uint32_t(lightest) & fill_mask;
      st.position[uint32_t(key)] = int32_t(pack * uint32_t(per_pack) + rank);
      // float32, in assignment order; a full pack gets kNever: never chosen again.
      const float sum = std::bit_cast<float>(uint32_t(lightest >> 32)) + value_of_descending(key);
      const uint64_t next = (uint64_t(std::bit_cast<uint32_t>(sum)) << 32) | (uint32_t(lightest) + 1);
      update_path<kLeaves>(st.tree, leaves, int(pack), int(rank) + 1 < per_pack ? next : kNever);
    }
}

}  // namespace

// Sets up every job's state. When the first num_packs - 1 items of every
// job weigh more than 0, item k < num_packs goes to pack k (all packs are
// empty and the lowest index wins; each item then makes its pack heavier
// than the empty ones): those steps are taken here, and the returned first
// step of the greedy loop skips them.
int BatchPacker::start_jobs(const Job* jobs, int num_jobs, int num_packs, int per_pack, int leaves, int fill_bits) {
  bool positive = num_packs >= 2;
  for (int b = 0; b < num_jobs && positive; ++b) positive = value_of_descending(jobs[b].items[num_packs - 2]) > 0.0f;
  tree_.assign(size_t(2 * leaves) * size_t(num_jobs), kNever);
  states_.resize(size_t(num_jobs));
  for (int b = 0; b < num_jobs; ++b) {
    State& st = states_[size_t(b)];
    st = {jobs[b].items, jobs[b].position, tree_.data() + size_t(2 * leaves) * size_t(b)};
    for (int p = 0; p < num_packs; ++p) {
      uint64_t key = pack_key(0.0f, uint32_t(p), fill_bits, 0);
      if (positive) {
        st.position[index_of(st.items[p])] = p * per_pack;
        key = pack_key(value_of_descending(st.items[p]), uint32_t(p), fill_bits, 1);
      }
      st.tree[leaves + p] = key;
    }
    build_tree(st.tree, leaves);
  }
  return positive ? num_packs : 0;
}

void BatchPacker::run(const Job* jobs, int num_jobs, int num_items, int num_packs) {
  const int per_pack = num_items / num_packs;
  if (per_pack == 1) {  // the published special case: item i to pack i
    for (int b = 0; b < num_jobs; ++b)
      for (int i = 0; i < num_items; ++i) jobs[b].position[i] = i;
    return;
  }
  if (num_packs == 1) {  // one pack takes every item in packing order
    for (int b = 0; b < num_jobs; ++b)
      for (int i = 0; i < num_items; ++i) jobs[b].position[index_of(jobs[b].items[i])] = i;
    return;
  }
  // Pack and fill share the key's low half: num_items < 2^31 bounds
  // bit_width(num_packs - 1) + bit_width(per_pack - 1) by 32.
  const int fill_bits = int(std::bit_width(unsigned(per_pack - 1)));
  const int leaves = leaves_for(num_packs);
  const int first_step = start_jobs(jobs, num_jobs, num_packs, per_pack, leaves, fill_bits);
  dispatch_leaves(leaves, [&](auto fixed) {
    pack_interleaved<decltype(fixed)::value>(states_.data(), num_jobs, first_step, num_items, per_pack, fill_bits,
                                             leaves);
  });
}

void balanced_packing(const float* weight, int num_items, int num_packs, int32_t* position,
                      std::vector<uint64_t>& keys, std::vector<uint64_t>& spare, BatchPacker& packer) {
  keys.resize(size_t(num_items));
  for (int i = 0; i < num_items; ++i) keys[size_t(i)] = descending_key(weight[i], i);
  sort_keys(keys.data(), num_items, spare);
  const BatchPacker::Job job{keys.data(), position};
  packer.run(&job, 1, num_items, num_packs);
}

}  // namespace eplb::deepseek_detail
