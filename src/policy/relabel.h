// relabel.h - renumbering a layer's per-rank expert sets onto ranks so that
// as many experts as possible stay in place (internal to src/policy/).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "eplb/placement.h"

namespace eplb::policies {

// Returns a phy2log whose ranks hold exactly the multisets of `fresh`'s
// ranks (rank a's contents moved to rank assignment[a]), chosen to maximize
// the number of slots equal to `old`: an optimal rank-to-rank assignment
// (Hungarian), inside each node with nodes mapped onto nodes when
// `keep_nodes_whole` (deepseek's hierarchical case), else over all ranks.
// Inside a rank, every expert that the old rank also held keeps its old
// slot; the others fill the remaining slots in fresh's order.
std::vector<int32_t> relabel_layer(std::span<const int32_t> fresh, std::span<const int32_t> old,
                                   const Topology& topology, bool keep_nodes_whole);

}  // namespace eplb::policies
