// deepseek_packing.h - DeepSeek's balanced packing over caller-owned
// buffers (internal to src/policy/).
//
// The published rule, in float32: items in descending weight (equal: lower
// index first) each go to the lightest pack that is not full (equal: lower
// pack index); a pack's load is accumulated in float32 in assignment order.
// When every pack takes exactly one item, item i goes to pack i.
#pragma once

#include <cstdint>
#include <vector>

#include "deepseek_keys.h"

namespace eplb::deepseek_detail {

// Packs a batch of independent problems of one shape (num_items items into
// num_packs packs of num_items / num_packs), advancing all of them one item
// per step so that their dependency chains overlap.
class BatchPacker {
 public:
  struct Job {
    const uint64_t* items;  // descending keys (value, item index), already in packing order
    int32_t* position;      // [num_items], by item index: pack * (num_items / num_packs) + the
                            // order in which the pack received the item
  };
  void run(const Job* jobs, int num_jobs, int num_items, int num_packs);

  // One job's state as the interleaved loop reads it.
  struct State {
    const uint64_t* items;
    int32_t* position;
    uint64_t* tree;  // a tournament tree over the packs' keys: (load, pack, items held)
  };

 private:
  int start_jobs(const Job* jobs, int num_jobs, int num_packs, int per_pack, int leaves, int fill_bits);

  std::vector<uint64_t> tree_;  // per job: a tournament tree over its packs
  std::vector<State> states_;
};

// Packs weight[0..n) (any order) with the rule above, for small inputs
// (the groups of a layer); writes position[n] as a Job does. Uses keys and
// spare as scratch.
void balanced_packing(const float* weight, int num_items, int num_packs, int32_t* position,
                      std::vector<uint64_t>& keys, std::vector<uint64_t>& spare, BatchPacker& packer);

}  // namespace eplb::deepseek_detail
