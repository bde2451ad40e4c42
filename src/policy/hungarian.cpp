// Hungarian method, O(n^3): rows are added one at a time; each addition
// grows an alternating tree by Dijkstra-like steps over reduced costs
// (cost - u[row] - v[column]) until it reaches a free column, then flips the
// path. Potentials keep every reduced cost >= 0 and matched edges tight.
#include "hungarian.h"

#include <algorithm>
#include <cstddef>
#include <limits>

namespace eplb::policies {

using std::size_t;

std::vector<int> min_cost_assignment(const std::vector<double>& cost, int n) {
  if (n <= 0) return {};
  const double infinity = std::numeric_limits<double>::infinity();
  // 1-based internally; column 0 is the virtual root of each search.
  std::vector<double> row_potential(size_t(n) + 1, 0.0), column_potential(size_t(n) + 1, 0.0);
  std::vector<int> row_of_column(size_t(n) + 1, 0), previous_column(size_t(n) + 1, 0);
  std::vector<double> slack(size_t(n) + 1);
  std::vector<char> used(size_t(n) + 1);
  for (int row = 1; row <= n; ++row) {
    row_of_column[0] = row;
    int column = 0;
    std::fill(slack.begin(), slack.end(), infinity);
    std::fill(used.begin(), used.end(), 0);
    do {
      used[column] = 1;
      int current_row = row_of_column[column];
      double delta = infinity;
      int next_column = 0;
      const double* cost_row = cost.data() + size_t(current_row - 1) * n;
      for (int j = 1; j <= n; ++j) {
        if (used[j]) continue;
        double reduced = cost_row[j - 1] - row_potential[current_row] - column_potential[j];
        if (reduced < slack[j]) {
          slack[j] = reduced;
          previous_column[j] = column;
        }
        if (slack[j] < delta) {  // strict: lowest column wins ties
          delta = slack[j];
          next_column = j;
        }
      }
      for (int j = 0; j <= n; ++j) {
        if (used[j]) {
          row_potential[row_of_column[j]] += delta;
          column_potential[j] -= delta;
        } else {
          slack[j] -= delta;
        }
      }
      column = next_column;
    } while (row_of_column[column] != 0);
    do {  // flip the augmenting path back to the root
      int from = previous_column[column];
      row_of_column[column] = row_of_column[from];
      column = from;
    } while (column != 0);
  }
  std::vector<int> column_of_row(static_cast<size_t>(n), -1);
  for (int j = 1; j <= n; ++j) column_of_row[row_of_column[j] - 1] = j - 1;
  return column_of_row;
}

std::vector<int> max_gain_assignment(const std::vector<int>& gain, int n) {
  std::vector<double> cost(gain.size());
  for (size_t i = 0; i < gain.size(); ++i) cost[i] = -double(gain[i]);
  return min_cost_assignment(cost, n);
}

}  // namespace eplb::policies
