// src/plan/edge_coloring.h - proper edge colouring of a bipartite multigraph
// with as many colours as its largest degree (Konig's line colouring
// theorem), for the transfer schedule (internal to src/plan/).
//
// Edges are coloured in the order given: each takes the lowest colour free
// at its left end; when that colour is taken at its right end, the
// alternating path of that colour and the right end's lowest free colour is
// flipped first (it never reaches the left end: left vertices on the path
// are entered by edges of the first colour, which the left end lacks).
// Deterministic; O(E * (D + path length)) time, O((L + R) * D) memory.
#pragma once

#include <cstdint>
#include <vector>

namespace eplb::plan_detail {

struct BipartiteEdge {
  int32_t left = 0;   // in [0, num_left)
  int32_t right = 0;  // in [0, num_right)
};

// The colour of every edge, in [0, D) where D is the largest degree; no two
// edges sharing an end have the same colour. `num_colors` receives D.
std::vector<int32_t> color_bipartite_edges(const std::vector<BipartiteEdge>& edges, int num_left, int num_right,
                                           int& num_colors);

}  // namespace eplb::plan_detail
