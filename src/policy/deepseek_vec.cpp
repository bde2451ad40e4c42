// deepseek_vec.cpp - SGLang's vectorised DeepSeek variant (eplb/deepseek_vec.h):
// checks, the hierarchical group packing and the per-layer driver. The
// chunk kernel (replication and the ranks' snake) is deepseek_vec_chunk.cpp.
#include "eplb/deepseek_vec.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <string>

#include "deepseek_vec_chunk.h"

namespace eplb {

namespace {

using deepseek_vec_detail::ChunkJob;
using deepseek_vec_detail::run_chunk;

Status invalid(const std::string& what) { return error(Code::InvalidArgument, "deepseek_vec: " + what); }

// SGLang's asserts, as errors: chunk = R / N (hierarchical) or R (flat).
Status check_shape(const VecShape& s, VecPrecision precision) {
  if (s.steps < 1 || s.layers < 1 || s.experts < 1)
    return invalid("tokens must be [steps >= 1][layers >= 1][experts >= 1], got [" + std::to_string(s.steps) + "][" +
                   std::to_string(s.layers) + "][" + std::to_string(s.experts) + "]");
  if (s.slots < s.experts)
    return invalid("num_physical_experts=" + std::to_string(s.slots) + " < experts=" + std::to_string(s.experts));
  if (s.local_slots < 1 || s.slots % s.local_slots != 0)
    return invalid("num_physical_experts=" + std::to_string(s.slots) + " is not a multiple of num_local_physical_experts=" +
                   std::to_string(s.local_slots));
  const int chunks = s.hierarchical ? s.nodes : 1;
  if (s.hierarchical) {
    if (s.groups < 1 || s.nodes < 1 || s.experts % s.groups != 0 || s.groups % s.nodes != 0)
      return invalid("hierarchical needs experts % groups == 0 and groups % nodes == 0, got " +
                     std::to_string(s.experts) + " experts, " + std::to_string(s.groups) + " groups, " +
                     std::to_string(s.nodes) + " nodes");
  }
  if (s.slots % chunks != 0 || s.experts % chunks != 0 || (s.slots - s.experts) % chunks != 0)
    return invalid("slots, experts and redundant slots must split evenly over " + std::to_string(chunks) + " chunk(s)");
  if ((s.slots / chunks) % s.local_slots != 0)
    return invalid("a chunk's " + std::to_string(s.slots / chunks) + " slots are not a multiple of " +
                   std::to_string(s.local_slots) + " slots per rank");
  return Status::ok();
}

Status check_values(const double* tokens, size_t count, VecPrecision precision) {
  if (tokens == nullptr) return invalid("tokens has no values");
  for (size_t i = 0; i < count; ++i) {
    const double v = tokens[i];
    if (!(v >= 0.0) || !std::isfinite(v))
      return invalid("token count " + std::to_string(i) + " is negative, infinite or NaN (" + std::to_string(v) + ")");
    if (precision == VecPrecision::Int && (v != std::floor(v) || v > 9007199254740992.0))
      return invalid("token count " + std::to_string(i) + " is not an integer below 2^53 (" + std::to_string(v) + ")");
  }
  return Status::ok();
}

// Hierarchical step 1 for one layer: float32 step sums (torch's order),
// group sums in index order, groups packed onto nodes (heaviest first, the
// lightest non-full node, lowest index on ties; float32 node sums).
// Writes mlog2log [E].
void pack_groups(const double* tokens, const VecShape& s, int layer, std::vector<float>& expert_sum,
                 int32_t* mlog2log) {
  const size_t plane = size_t(s.layers) * size_t(s.experts);
  const double* row = tokens + size_t(layer) * size_t(s.experts);
  for (int e = 0; e < s.experts; ++e)
    expert_sum[size_t(e)] = deepseek_vec_detail::cascade_sum<float>(
        s.steps, [&](int64_t step) { return float(row[size_t(step) * plane + size_t(e)]); });
  const int group_size = s.experts / s.groups, per_node = s.groups / s.nodes;
  std::vector<float> group(size_t(s.groups), 0.0f), node_load(size_t(s.nodes), 0.0f);
  for (int g = 0; g < s.groups; ++g)
    for (int j = 0; j < group_size; ++j) group[size_t(g)] += expert_sum[size_t(g * group_size + j)];
  std::vector<int> node_groups(size_t(s.nodes), 0);
  for (int g : deepseek_vec_detail::torch_descending_order(group)) {
    int best = -1;
    for (int node = 0; node < s.nodes; ++node)
      if (node_groups[size_t(node)] < per_node && (best < 0 || node_load[size_t(node)] < node_load[size_t(best)]))
        best = node;
    const int position = best * per_node + node_groups[size_t(best)]++;
    node_load[size_t(best)] += group[size_t(g)];
    for (int j = 0; j < group_size; ++j) mlog2log[position * group_size + j] = g * group_size + j;
  }
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
  EPLB_TRY(check_shape(shape, precision));
  const size_t count = size_t(shape.steps) * size_t(shape.layers) * size_t(shape.experts);
  EPLB_TRY(check_values(tokens, count, precision));
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
