// eplb/deepseek_vec.h - SGLang's vectorised DeepSeek variant
// (sglang.srt.eplb.eplb_algorithms.deepseek_vec), reproduced exactly.
//
// Contract: a pure, deterministic function of a window of per-step loads
// tokens [S][L][E] (row-major doubles holding the caller's values exactly)
// and the shape; same inputs, same output on every run and thread count.
//  - flat (decode): each layer's experts get R - E extra replicas, one at a
//    time: the expert whose replication lowers the sum over steps of each
//    step's hottest replica most (SGLang's scores, offsets and tie rules);
//  - hierarchical (prefill): groups are packed onto nodes first (float32
//    sums, heaviest group first, lightest non-full node, lowest index on
//    ties), then the same runs per node on R / N slots.
// When a rank holds more than one slot, each chunk's replicas are sorted by
// load per replica (descending, torch's tie order: std::sort) and dealt to its ranks in a snake.
// `precision` is the dtype SGLang would see: Int (any integer tensor: scores
// float32, the final per-expert sums exact), Float32, or Float64 (flat only;
// the hierarchical variant converts to float32 first, as SGLang does).
// Sums over steps follow torch's CPU order (blocks of 16 rows, cascaded);
// sums over a group's experts run in index order (torch's vector lanes may
// round differently: documented ties, docs/python.md).
// Outputs (int32): phy2log [L][R], log2phy [L][E][R - E + 1] (-1 padded,
// replica k of expert e at [e][k]), logcnt [L][E].
#pragma once

#include <cstdint>
#include <vector>

#include "eplb/status.h"

namespace eplb {

enum class VecPrecision { Int, Float32, Float64 };

struct VecShape {
  int steps = 0, layers = 0, experts = 0;
  int slots = 0;         // R, physical experts per layer
  int local_slots = 1;   // slots per rank
  int groups = 1;        // expert groups (hierarchical only)
  int nodes = 1;         // nodes (hierarchical only)
  bool hierarchical = false;
};

struct VecArrays {
  int num_layers = 0, num_experts = 0, num_slots = 0, width = 0;  // width = R - E + 1
  std::vector<int32_t> phy2log, log2phy, logcnt;
};

// Both functions refuse the same inputs (InvalidArgument, the message
// starting with the function's name): an empty window; sizes above the
// library's caps (E <= kMaxExpertsPerLayer, R <= kMaxSlotsPerLayer,
// L x R <= kMaxTableEntries, eplb/placement.h); SGLang's asserts (E <= R,
// R % local_slots, and when hierarchical E % groups, groups % nodes, ranks
// % nodes); no values; a value negative, infinite or NaN, or (Int) not an
// integer below 2^53. Then they run the algorithm.
Result<VecArrays> deepseek_vec(const double* tokens, const VecShape& shape, VecPrecision precision);

}  // namespace eplb

namespace eplb {

// DeepSeek's rebalance_experts as SGLang runs it under torch
// (sglang.srt.eplb.eplb_algorithms.deepseek, also behind elasticity_aware):
// the load is the window summed over steps (exactly for Int, torch's order
// for floats) in float32; groups packed onto nodes, experts replicated
// within nodes, replicas packed onto ranks: float32 loads, pack sums in
// float64 (SGLang adds Python floats from weight.tolist(); eplb's `deepseek`
// policy sums packs in float32, as DeepSeek's reference adds tensor
// scalars), and the two sorts' ties in torch's order (std::sort on values
// only; eplb's `deepseek` policy puts the lower index first). Global when !shape.hierarchical (one group, one
// node). Outputs: phy2log [L][R], log2phy [L][E][width = the largest
// replica count] (-1 padded; [e][k] is the slot of e's replica k), logcnt.
Result<VecArrays> deepseek_torch(const double* tokens, const VecShape& shape, VecPrecision precision);

}  // namespace eplb
