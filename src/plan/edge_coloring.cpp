#include "edge_coloring.h"

#include <algorithm>
#include <utility>

namespace eplb::plan_detail {

namespace {

class Coloring {
 public:
  Coloring(const std::vector<BipartiteEdge>& edges, int num_left, int num_right, int colors)
      : edges_(edges),
        colors_(colors),
        at_left_(size_t(num_left) * size_t(colors), -1),
        at_right_(size_t(num_right) * size_t(colors), -1),
        color_(edges.size(), -1) {}

  void color_all() {
    for (int32_t e = 0; e < int32_t(edges_.size()); ++e) color_one(e);
  }
  std::vector<int32_t> take() { return std::move(color_); }

 private:
  int32_t& left_slot(int32_t vertex, int32_t color) { return at_left_[size_t(vertex) * size_t(colors_) + size_t(color)]; }
  int32_t& right_slot(int32_t vertex, int32_t color) {
    return at_right_[size_t(vertex) * size_t(colors_) + size_t(color)];
  }
  int32_t free_at_left(int32_t vertex) {
    for (int32_t c = 0; c < colors_; ++c)
      if (left_slot(vertex, c) < 0) return c;
    return -1;  // unreachable: a vertex has at most `colors_` edges
  }
  int32_t free_at_right(int32_t vertex) {
    for (int32_t c = 0; c < colors_; ++c)
      if (right_slot(vertex, c) < 0) return c;
    return -1;
  }
  void assign(int32_t edge, int32_t color) {
    color_[size_t(edge)] = color;
    left_slot(edges_[size_t(edge)].left, color) = edge;
    right_slot(edges_[size_t(edge)].right, color) = edge;
  }
  void unassign(int32_t edge) {
    const int32_t color = color_[size_t(edge)];
    left_slot(edges_[size_t(edge)].left, color) = -1;
    right_slot(edges_[size_t(edge)].right, color) = -1;
    color_[size_t(edge)] = -1;
  }

  // Swaps colours a and b along the alternating path that starts at right
  // vertex `start` with its edge of colour a.
  void flip_path(int32_t start, int32_t a, int32_t b) {
    path_.clear();
    bool on_right = true;
    int32_t vertex = start, color = a;
    while (true) {
      const int32_t edge = on_right ? right_slot(vertex, color) : left_slot(vertex, color);
      if (edge < 0) break;
      path_.push_back(edge);
      vertex = on_right ? edges_[size_t(edge)].left : edges_[size_t(edge)].right;
      on_right = !on_right;
      color = color == a ? b : a;
    }
    for (int32_t edge : path_) unassign(edge);
    for (size_t i = 0; i < path_.size(); ++i) assign(path_[i], i % 2 == 0 ? b : a);
  }

  void color_one(int32_t edge) {
    const BipartiteEdge& e = edges_[size_t(edge)];
    const int32_t a = free_at_left(e.left);
    if (right_slot(e.right, a) >= 0) flip_path(e.right, a, free_at_right(e.right));
    assign(edge, a);
  }

  const std::vector<BipartiteEdge>& edges_;
  int32_t colors_;
  std::vector<int32_t> at_left_, at_right_;  // [vertex][color] -> edge, or -1
  std::vector<int32_t> color_;               // [edge]
  std::vector<int32_t> path_;
};

}  // namespace

std::vector<int32_t> color_bipartite_edges(const std::vector<BipartiteEdge>& edges, int num_left, int num_right,
                                           int& num_colors) {
  std::vector<int32_t> left_degree(size_t(num_left), 0), right_degree(size_t(num_right), 0);
  int32_t colors = 0;
  for (const BipartiteEdge& e : edges) {
    colors = std::max(colors, ++left_degree[size_t(e.left)]);
    colors = std::max(colors, ++right_degree[size_t(e.right)]);
  }
  num_colors = colors;
  if (edges.empty()) return {};
  Coloring coloring(edges, num_left, num_right, colors);
  coloring.color_all();
  return coloring.take();
}

}  // namespace eplb::plan_detail
