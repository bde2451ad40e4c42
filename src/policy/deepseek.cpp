// deepseek.cpp - the `deepseek` policy: DeepSeek's published EPLB algorithm
// (rebalance_experts), reproduced exactly.
//
// The algorithm, per block of layers: deepseek_layer.h. Blocks run on the
// shared thread pool, each worker with its own scratch.
// log2phy[e][k] is the slot of the replica of expert e created k-th, and its
// width is the largest replica count over all layers, as the reference does.
#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include "deepseek_layer.h"
#include "eplb/common.h"
#include "eplb/policy.h"
#include "layer_tools.h"
#include "policies.h"

namespace eplb {

namespace {

using deepseek_detail::DeepSeekShape;
using deepseek_detail::LayerBlock;
using deepseek_detail::LayerOutput;

class DeepSeekPolicy final : public Policy {
 public:
  std::string name() const override { return "deepseek"; }

  Result<Placement> place(const LoadMatrix& load, const Topology& topology, const Placement& current,
                          const PolicyOptions& options) const override {
    EPLB_ASSIGN_OR_RETURN(Placement placement, deepseek_placement(load, topology, options.threads));
    // Anti-affinity is post-processing (swaps that separate duplicate
    // replicas, then the same hysteresis; layer_tools.h): asked for, the
    // output is no longer DeepSeek's exactly; by default it is untouched.
    if (options.anti_affinity)
      return policies::apply_common_options(std::move(placement), load, topology, current, options);
    if (options.min_gain <= 0) return placement;
    // Hysteresis: keep the current mapping of layers that would gain too little.
    EPLB_TRY(current.validate_against(topology).with_context("policy 'deepseek' with min_gain: current placement"));
    BalanceSummary before = balancedness(current, load, topology);
    BalanceSummary after = balancedness(placement, load, topology);
    for (int l = 0; l < topology.num_layers; ++l)
      if (after.per_layer[l] - before.per_layer[l] < options.min_gain)
        EPLB_TRY(placement.set_layer(l, current, l));
    return placement;
  }
};

Status check_inputs(LoadView load, const Topology& topology) {
  EPLB_TRY(topology.validate().with_context("deepseek"));
  if (load.num_layers != topology.num_layers || load.num_experts != topology.num_experts)
    return error(Code::InvalidArgument, "deepseek: load is " + std::to_string(load.num_layers) + " layers x " +
                                            std::to_string(load.num_experts) + " experts but the topology is " +
                                            topology.to_string());
  // The values themselves are checked while they are converted (LayerBlock).
  return Status::ok();
}

// The error for a load a worker found invalid, with LoadMatrix::validate's
// message (a copy, on this failure path only).
Status invalid_load(LoadView view) {
  LoadMatrix load(view.num_layers, view.num_experts);
  std::copy(view.values, view.values + load.values.size(), load.values.begin());
  Status status = load.validate().with_context("deepseek");
  return status.is_ok() ? error(Code::Internal, "deepseek: a load value was flagged invalid but validates") : status;
}

// Layer l of log2phy: log2phy[e][k] = the slot of the replica of e created
// k-th; its width is the largest replica count over all layers, as the
// reference's is. Unless `pad` is false (the layer already holds -1), the
// layer is padded first, while it is in cache.
template <typename Index>
void write_log2phy_layer(const DeepSeekArrays& arrays, size_t l, Index* out, bool pad) {
  const size_t experts = size_t(arrays.num_experts), slots = size_t(arrays.num_slots);
  const size_t width = size_t(arrays.max_replicas);
  Index* layer = out + l * experts * width;
  if (pad) std::fill(layer, layer + experts * width, Index(-1));
  const int32_t* phy2log = arrays.phy2log.data() + l * slots;
  const int32_t* phyrank = arrays.phyrank.data() + l * slots;
  for (size_t slot = 0; slot < slots; ++slot) layer[size_t(phy2log[slot]) * width + size_t(phyrank[slot])] = Index(slot);
}

}  // namespace

template <typename Index>
void write_log2phy(const DeepSeekArrays& arrays, Index* out, int threads) {
  parallel_for(size_t(arrays.num_layers), threads,
               [&](size_t l) { write_log2phy_layer(arrays, l, out, /*pad=*/true); });
}
template void write_log2phy<int32_t>(const DeepSeekArrays&, int32_t*, int);
template void write_log2phy<int64_t>(const DeepSeekArrays&, int64_t*, int);

Result<DeepSeekArrays> deepseek_arrays(const LoadMatrix& load, const Topology& topology, int threads) {
  const LoadView view{load.values.data(), load.num_layers, load.num_experts};
  EPLB_TRY(check_inputs(view, topology));
  if (load.values.size() != size_t(load.num_layers) * size_t(load.num_experts))
    return load.validate().with_context("deepseek");
  return deepseek_arrays(view, topology, threads);
}

Result<DeepSeekArrays> deepseek_arrays(LoadView load, const Topology& topology, int threads) {
  EPLB_TRY(check_inputs(load, topology));
  if (load.values == nullptr) return error(Code::InvalidArgument, "deepseek: the load has no values");
  const DeepSeekShape shape(topology);
  const int layers = topology.num_layers;
  DeepSeekArrays arrays{layers, shape.experts, shape.slots, 0, {}, {}, {}};
  arrays.phy2log.resize(size_t(layers) * size_t(shape.slots));
  arrays.phyrank.resize(arrays.phy2log.size());
  arrays.logcnt.resize(size_t(layers) * size_t(shape.experts));

  // Blocks of layers handed to whichever worker is free, each worker with
  // its thread's scratch: the result does not depend on the split, only the
  // speed does.
  const int blocks = (layers + shape.block_layers - 1) / shape.block_layers;
  const int workers = std::clamp(threads, 1, blocks);
  // A worker's scratch is read only by its own thread: once this call's
  // items are done, a pool worker may already serve another caller's call
  // and reset it, so what this call must know (an invalid load) is copied
  // into the call's own vector inside the item.
  std::vector<LayerBlock*> scratch(static_cast<size_t>(workers), nullptr);
  std::vector<char> saw_invalid(static_cast<size_t>(workers), 0);
  const LayerOutput out{arrays.phy2log.data(), arrays.phyrank.data(), arrays.logcnt.data()};
  parallel_for(size_t(blocks), workers, [&](size_t block, int worker) {
    LayerBlock*& mine = scratch[size_t(worker)];
    if (mine == nullptr) mine = &LayerBlock::for_this_thread(shape);
    const int first = int(block) * shape.block_layers;
    mine->run(load.values, first, std::min(shape.block_layers, layers - first), out);
    if (mine->saw_invalid_load()) saw_invalid[size_t(worker)] = 1;
  });

  if (std::find(saw_invalid.begin(), saw_invalid.end(), 1) != saw_invalid.end()) return invalid_load(load);
  arrays.max_replicas = *std::max_element(arrays.logcnt.begin(), arrays.logcnt.end());
  return arrays;
}

Result<Placement> deepseek_placement(const LoadMatrix& load, const Topology& topology, int threads) {
  EPLB_ASSIGN_OR_RETURN(DeepSeekArrays arrays, deepseek_arrays(load, topology, threads));
  // Filled with the padding once, as it is allocated (not zeroed, then padded).
  std::vector<int32_t> log2phy(
      size_t(arrays.num_layers) * size_t(arrays.num_experts) * size_t(arrays.max_replicas), -1);
  parallel_for(size_t(arrays.num_layers), std::clamp(threads, 1, arrays.num_layers),
               [&](size_t l) { write_log2phy_layer(arrays, l, log2phy.data(), /*pad=*/false); });
  // Valid by construction; tests/policy checks every invariant on every shape they run.
  return Placement::from_arrays_unchecked(arrays.num_layers, arrays.num_experts, arrays.num_slots,
                                          arrays.max_replicas, std::move(arrays.phy2log), std::move(log2phy),
                                          std::move(arrays.logcnt));
}

namespace policies {
std::unique_ptr<Policy> make_deepseek() { return std::make_unique<DeepSeekPolicy>(); }
}  // namespace policies

}  // namespace eplb
