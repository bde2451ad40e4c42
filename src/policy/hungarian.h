// hungarian.h - optimal assignment (internal to src/policy/).
//
// min_cost_assignment solves the square assignment problem exactly with the
// O(n^3) Hungarian method (shortest augmenting paths with dual potentials).
// Deterministic: ties are broken by the lowest index, so the same matrix
// always gives the same assignment.
#pragma once

#include <vector>

namespace eplb::policies {

// cost is row-major n x n. Returns column_of_row (a permutation of 0..n-1)
// minimizing the sum of cost[row][column_of_row[row]].
std::vector<int> min_cost_assignment(const std::vector<double>& cost, int n);

// Same, maximizing the total of an integer gain matrix (row-major n x n).
std::vector<int> max_gain_assignment(const std::vector<int>& gain, int n);

}  // namespace eplb::policies
