// deepseek_vec_chunk.cpp - one chunk of SGLang's deepseek_vec (deepseek_vec_chunk.h).
#include "deepseek_vec_chunk.h"

#include "deepseek_sglang_common.h"

#include <algorithm>
#include <numeric>

namespace eplb::deepseek_vec_detail {

namespace {

// Each step's hottest expert (first of equal maxima), its score, and the
// step's maximum were it replicated (the second largest, or its own score
// with one more replica, whichever is larger).
template <typename T>
void step_maxima(ChunkJob<T>& job) {
  const int n = job.n;
  for (int s = 0; s < job.steps; ++s) {
    const T* score = job.score.data() + size_t(s) * size_t(n);
    int top = 0;
    for (int j = 1; j < n; ++j)
      if (score[j] > score[top]) top = j;
    T second = T(0);
    bool any = false;
    for (int j = 0; j < n; ++j)
      if (j != top && (!any || score[j] > second)) second = score[j], any = true;
    const T replicated = job.tokens[size_t(s) * size_t(n) + size_t(top)] / T(job.count[size_t(top)] + 1);
    job.top[size_t(s)] = top;
    job.best[size_t(s)] = score[top];
    job.after[size_t(s)] = any && second > replicated ? second : replicated;
  }
}

// The expert to replicate: the smallest total over steps (lowest index on
// ties). Experts that are no step's hottest all total the same (the sum of
// the maxima), so only the first of them competes.
template <typename T>
int choose(ChunkJob<T>& job) {
  const int n = job.n;
  std::fill(job.is_top.begin(), job.is_top.end(), 0);
  for (int s = 0; s < job.steps; ++s) job.is_top[size_t(job.top[size_t(s)])] = 1;
  int pick = -1;
  T pick_total = T(0);
  bool base_done = false;
  for (int j = 0; j < n; ++j) {
    if (!job.is_top[size_t(j)] && base_done) continue;
    const T total = cascade_sum<T>(job.steps, [&](int64_t s) {
      return job.top[size_t(s)] == j ? job.after[size_t(s)] : job.best[size_t(s)];
    });
    if (!job.is_top[size_t(j)]) base_done = true;
    if (pick < 0 || total < pick_total) pick = j, pick_total = total;
  }
  return pick;
}

// Replicas sorted by step-summed load per replica (descending, torch's tie order),
// dealt to the chunk's ranks in a snake: rank g's k-th slot takes sorted
// position k * ranks + (k odd ? ranks - 1 - g : g).
template <typename T>
void deal_to_ranks(ChunkJob<T>& job, int local_slots) {
  const int slots = job.slots, ranks = slots / local_slots;
  std::vector<T> load(static_cast<size_t>(slots));
  for (int q = 0; q < slots; ++q) {
    const int32_t j = job.phy2local[size_t(q)];
    load[size_t(q)] = job.step_sum[size_t(j)] / T(job.count[size_t(j)]);
  }
  const std::vector<int32_t> order = torch_descending_order(load);
  std::vector<int32_t> new_of_old(static_cast<size_t>(slots)), phy(static_cast<size_t>(slots));
  for (int g = 0; g < ranks; ++g)
    for (int k = 0; k < local_slots; ++k) {
      const int old = order[size_t(k * ranks + (k % 2 == 1 ? ranks - 1 - g : g))];
      const int q = g * local_slots + k;
      phy[size_t(q)] = job.phy2local[size_t(old)];
      new_of_old[size_t(old)] = q;
    }
  job.phy2local.swap(phy);
  for (int32_t& slot : job.replica_slot)
    if (slot >= 0) slot = new_of_old[size_t(slot)];
}

}  // namespace

template <typename T>
void ChunkJob<T>::load(const double* all, const VecShape& shape, int layer, const int32_t* experts, int first_index,
                       int n_, int slots_, VecPrecision precision) {
  steps = shape.steps, n = n_, slots = slots_, width = shape.slots - shape.experts + 1;
  const size_t plane = size_t(shape.layers) * size_t(shape.experts);
  const double* row = all + size_t(layer) * size_t(shape.experts);
  tokens.resize(size_t(steps) * size_t(n));
  offset.resize(size_t(n));
  step_sum.resize(size_t(n));
  for (int j = 0; j < n; ++j) {
    offset[size_t(j)] = T(float(first_index + j) * 1e-4f);  // torch: int32 arange * 1e-4 in float32
    const size_t e = size_t(experts[j]);
    for (int s = 0; s < steps; ++s) tokens[size_t(s) * size_t(n) + size_t(j)] = T(row[size_t(s) * plane + e]);
    step_sum[size_t(j)] = summed_over_steps<T>(all, shape, size_t(layer) * size_t(shape.experts) + e, precision);
  }
}

template <typename T>
void run_chunk(ChunkJob<T>& job, int local_slots) {
  const int n = job.n, steps = job.steps, extra = job.slots - n;
  job.count.assign(size_t(n), 1);
  job.phy2local.resize(size_t(job.slots));
  job.replica_slot.assign(size_t(n) * size_t(job.width), -1);
  for (int j = 0; j < n; ++j) job.phy2local[size_t(j)] = j, job.replica_slot[size_t(j) * size_t(job.width)] = j;
  job.score.resize(size_t(steps) * size_t(n));
  job.best.resize(size_t(steps));
  job.after.resize(size_t(steps));
  job.top.resize(size_t(steps));
  job.is_top.resize(size_t(n));
  for (size_t i = 0; i < job.score.size(); ++i) job.score[i] = job.tokens[i] + job.offset[i % size_t(n)];
  for (int i = 0; i < extra; ++i) {
    step_maxima(job);
    const int pick = choose(job);
    job.phy2local[size_t(n + i)] = pick;
    job.replica_slot[size_t(pick) * size_t(job.width) + size_t(job.count[size_t(pick)])] = n + i;
    const T count = T(++job.count[size_t(pick)]);
    for (int s = 0; s < steps; ++s) {
      const size_t at = size_t(s) * size_t(n) + size_t(pick);
      job.score[at] = (job.tokens[at] + job.offset[size_t(pick)]) / count;
    }
  }
  if (local_slots > 1) deal_to_ranks(job, local_slots);
}

template struct ChunkJob<float>;
template struct ChunkJob<double>;
template void run_chunk<float>(ChunkJob<float>&, int);
template void run_chunk<double>(ChunkJob<double>&, int);

}  // namespace eplb::deepseek_vec_detail
