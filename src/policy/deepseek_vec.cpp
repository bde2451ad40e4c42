// deepseek_vec.cpp - SGLang's vectorised DeepSeek variant (eplb/deepseek_vec.h):
// the hierarchical group packing and the per-layer driver. The chunk kernel
// (replication and the ranks' snake) is deepseek_vec_chunk.cpp; the input
// check, step sums and packing it shares with deepseek_torch are
// deepseek_sglang_common.h.
#include "eplb/deepseek_vec.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <string>

#include "deepseek_sglang_common.h"
#include "deepseek_vec_chunk.h"

namespace eplb {

namespace {

using deepseek_vec_detail::ChunkJob;
using deepseek_vec_detail::group_weights;
using deepseek_vec_detail::pack_heaviest_first;
using deepseek_vec_detail::place_groups;
using deepseek_vec_detail::run_chunk;
using deepseek_vec_detail::summed_over_steps;

// Hierarchical step 1 for one layer: float32 step sums (torch's order),
// group sums in index order, groups packed onto nodes (heaviest first, the
// lightest non-full node, lowest index on ties; float32 node sums).
// Writes mlog2log [E].
void pack_groups(const double* tokens, const VecShape& s, int layer, std::vector<float>& expert_sum,
                 int32_t* mlog2log) {
  for (int e = 0; e < s.experts; ++e)
    expert_sum[size_t(e)] =
        summed_over_steps<float>(tokens, s, size_t(layer) * size_t(s.experts) + size_t(e), VecPrecision::Float32);
  place_groups(pack_heaviest_first<float>(group_weights(expert_sum, s.groups), s.nodes), s.experts / s.groups,
               mlog2log);
}

// One layer: each chunk's job, then the chunk results mapped back through
// mlog2log into the layer's rows of the outputs.
template <typename T>
void run_layer(const double* tokens, const VecShape& s, VecPrecision precision, int layer, VecArrays& out) {
  const int chunks = s.hierarchical ? s.nodes : 1;
  const int n = s.experts / chunks, chunk_slots = s.slots / chunks, width = out.width;
  std::vector<int32_t> mlog2log(size_t(s.experts));
  std::vector<float> expert_sum(size_t(s.experts));
  if (s.hierarchical) pack_groups(tokens, s, layer, expert_sum, mlog2log.data());
  else std::iota(mlog2log.begin(), mlog2log.end(), 0);
  int32_t* phy2log = out.phy2log.data() + size_t(layer) * size_t(s.slots);
  int32_t* log2phy = out.log2phy.data() + size_t(layer) * size_t(s.experts) * size_t(width);
  int32_t* logcnt = out.logcnt.data() + size_t(layer) * size_t(s.experts);
  ChunkJob<T> job;
  for (int c = 0; c < chunks; ++c) {
    job.load(tokens, s, layer, mlog2log.data() + c * n, c * n, n, chunk_slots, precision);
    run_chunk(job, s.local_slots);
    for (int q = 0; q < chunk_slots; ++q) phy2log[c * chunk_slots + q] = mlog2log[size_t(c * n + job.phy2local[size_t(q)])];
    for (int j = 0; j < n; ++j) {
      const int e = mlog2log[size_t(c * n + j)];
      logcnt[e] = job.count[size_t(j)];
      for (int k = 0; k < width; ++k) {
        const int32_t slot = k < job.count[size_t(j)] ? job.replica_slot[size_t(j) * size_t(width) + size_t(k)] : -1;
        log2phy[size_t(e) * size_t(width) + size_t(k)] = slot < 0 ? -1 : c * chunk_slots + slot;
      }
    }
  }
}

}  // namespace

Result<VecArrays> deepseek_vec(const double* tokens, const VecShape& shape, VecPrecision precision) {
  EPLB_TRY(deepseek_vec_detail::check_input("deepseek_vec", tokens, shape, precision));
  VecArrays out;
  out.num_layers = shape.layers;
  out.num_experts = shape.experts;
  out.num_slots = shape.slots;
  out.width = shape.slots - shape.experts + 1;
  out.phy2log.assign(size_t(shape.layers) * size_t(shape.slots), 0);
  out.log2phy.assign(size_t(shape.layers) * size_t(shape.experts) * size_t(out.width), -1);
  out.logcnt.assign(size_t(shape.layers) * size_t(shape.experts), 0);
  for (int layer = 0; layer < shape.layers; ++layer) {
    if (precision == VecPrecision::Float64 && !shape.hierarchical) run_layer<double>(tokens, shape, precision, layer, out);
    else run_layer<float>(tokens, shape, shape.hierarchical ? VecPrecision::Float32 : precision, layer, out);
  }
  return out;
}

}  // namespace eplb
