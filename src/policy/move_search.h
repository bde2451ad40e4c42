// move_search.h - local search on one layer's placement by slot moves
// (internal to src/policy/), shared by `incremental` and `balanced`.
//
// Moves, each judged by how much it lowers the layer's maximum rank load
// per slot it rewrites (ties: the larger drop of the sum of squared rank
// loads, then the first candidate found):
//   retarget(s, h): slot s stops holding its expert c (which keeps >= 1
//                   other replica) and holds expert h instead; 1 slot;
//   swap(a, b):     slots a and b on two ranks exchange their experts; 2 slots.
// Candidates are built around the most loaded rank M: swaps of M's slots
// with slots of the lightest ranks; retargets of M's redundant replicas to
// the coldest experts; new replicas of M's experts in the best donor slots.
// The cost of a move is the change in the number of slots that differ from
// the starting placement, so the budget bounds exactly what a migration
// from the start must rewrite. Deterministic (no clock, no randomness).
#pragma once

#include <climits>
#include <cstdint>
#include <span>
#include <vector>

#include "eplb/placement.h"

namespace eplb::policies {

struct SearchLimits {
  int budget_slots = INT_MAX;        // max slots differing from the start
  int max_iterations = 64;           // accepted moves at most
  double min_relative_gain = 0.0;    // a move must lower the max by more than this x max
  bool accept_plateau = false;       // also accept moves keeping the max and lowering the sum of squares
  bool anti_affinity = false;        // never two replicas of one expert on one rank
  bool allow_retarget = true;        // change replica counts (else swaps only)
  int swap_partner_ranks = 8;        // lightest ranks tried as swap partners of M
  int cold_candidates = 6;           // coldest experts tried as retarget targets of M's slots
  int donor_candidates = 12;         // donor slots tried for a new replica of an expert on M
};

class LayerSearch {
 public:
  LayerSearch(std::span<const double> load, const Topology& topology, std::span<const int32_t> start);

  // Applies the best move while one is acceptable; returns the moves made.
  int improve(const SearchLimits& limits);

  const std::vector<int32_t>& phy2log() const { return slot_expert_; }
  int slots_changed() const { return changed_; }
  double max_load();

 private:
  struct Candidate {
    int kind = 0;  // 0 none, 1 swap, 2 retarget
    int slot = -1, other = -1;  // swap: slots; retarget: slot, expert
    double key_gain = 0, key_square = 0;
    int cost = 0;
  };

  double weight(int expert) const { return load_[size_t(expert)] / count_[size_t(expert)]; }
  bool rank_holds(int rank, int expert) const;
  int cost_of(int slot, int new_expert) const;
  void refresh();
  double top_excluding(int stamp) const;
  void consider(Candidate& best, const Candidate& candidate, double gain, double square_gain, int budget_left,
                const SearchLimits& limits) const;
  void try_swap(Candidate& best, int a, int b, int budget_left, const SearchLimits& limits);
  void try_retarget(Candidate& best, int slot, int expert, int budget_left, const SearchLimits& limits);
  void apply(const Candidate& move);

  std::span<const double> load_;
  int experts_, slots_, ranks_, per_rank_;
  std::vector<int32_t> start_, slot_expert_;
  std::vector<int> count_;
  std::vector<int> next_replica_, head_;  // singly linked replica slots per expert
  std::vector<double> rank_load_;
  std::vector<int> order_;  // ranks by load, heaviest first (ties: lowest rank)
  std::vector<int> stamp_;
  int stamp_value_ = 0;
  int changed_ = 0;
  double current_max_ = 0;
  // scratch for retarget evaluation
  std::vector<int> affected_rank_;
  std::vector<double> affected_delta_;
};

}  // namespace eplb::policies
