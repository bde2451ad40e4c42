// move_search.h - local search on one layer's placement by slot moves
// (internal to src/policy/), shared by `incremental` and `balanced`.
//
// Each rank r has a load L_r (a replica carries load / count of its
// expert), a sum of squared replica loads Q_r, and a score
//   S_r = L_r + noise_weight * sqrt(Q_r)
// (noise_weight 0: the plain load). The search lowers max_r S_r. With
// noise_weight > 0 the score anticipates drift: if every expert's next load
// deviates by a relative error of about sigma, a rank's deviation is about
// sigma * sqrt(Q_r), so ranks whose load sits on one heavy replica score
// higher than ranks with many light ones, and hot experts get replicas.
//
// Moves, each judged by how much it lowers max S per slot it rewrites
// (ties: the larger drop of the sum of squared scores, then the first
// candidate found):
//   retarget(s, h): slot s stops holding its expert c (which keeps >= 1
//                   other replica) and holds expert h instead; 1 slot;
//   swap(a, b):     slots a and b on two ranks exchange their experts; 2 slots.
// Candidates are built around the top-scoring rank M: swaps of M's slots
// with slots of the lowest-scoring ranks; retargets of M's redundant
// replicas to the coldest experts; new replicas of M's experts in the best
// donor slots. The cost of a move is the change in the number of slots that
// differ from the starting placement, so the budget bounds exactly what a
// migration from the start must rewrite. Deterministic (no clock, no
// randomness, no dependence on threads).
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
  double min_relative_gain = 0.0;    // a move must lower max S by more than this x max S
  bool accept_plateau = false;       // also accept moves keeping max S and lowering the sum of squared scores
  bool anti_affinity = false;        // never two replicas of one expert on one rank
  bool allow_retarget = true;        // change replica counts (else swaps only)
  double noise_weight = 0.0;         // weight of sqrt(Q_r) in the rank score
  int swap_partner_ranks = 2;        // lowest-scoring ranks tried as swap partners of M
  int cold_candidates = 1;           // coldest experts tried as retarget targets of M's slots
  int donor_candidates = 6;          // donor slots tried for a new replica of an expert on M
};

class LayerSearch {
 public:
  LayerSearch(std::span<const double> load, const Topology& topology, std::span<const int32_t> start);

  // Applies the best move while one is acceptable; returns the moves made.
  int improve(const SearchLimits& limits);

  const std::vector<int32_t>& phy2log() const { return slot_expert_; }
  int slots_changed() const { return changed_; }
  // Largest plain rank load of the current state.
  double max_load() const;
  // Largest rank score (with improve()'s noise weight) after the last improve().
  double max_score() const { return current_max_; }

 private:
  struct Candidate {
    int kind = 0;               // 0 none, 1 swap, 2 retarget
    int slot = -1, other = -1;  // swap: two slots; retarget: slot, new expert
    double key_gain = 0, key_square = 0;
    int cost = 0;
  };
  struct Donor {
    int slot, expert, rank;
    double rank_load_after, rank_square_after;  // s's rank without c
    double sibling_peak;    // largest score of a rank holding another replica of c, after
    double sibling_square;  // drop of the sum of squared scores over those ranks
    int ranks[8];           // s's rank and the sibling ranks
    int num_ranks;
    bool simple;            // those ranks are distinct and few enough for the fast path
  };
  struct Receiver {
    int expert;
    double weight_before, weight_after;  // load / count of each replica, before and after
    double peak;                         // largest score of a rank holding it, after
    double square_gain;                  // drop of the sum of squared scores over those ranks
    bool simple;                         // its replicas are on distinct ranks
  };

  double weight(int expert) const { return load_[size_t(expert)] / count_[size_t(expert)]; }
  double score(double load, double square) const;
  bool rank_holds(int rank, int expert) const;
  int cost_of(int slot, int new_expert) const;
  void refresh();             // recomputes weights, rank loads, scores and the order
  void sort_ranks();          // re-sorts order_ after a move
  void reweigh(int expert);   // after its count changed: its weight and its ranks
  double heaviest_other(const int* ranks, int count) const;  // top score outside `ranks`
  bool acceptable(double gain, double square_gain, const SearchLimits& limits) const;
  void consider(Candidate& best, Candidate candidate, double gain, double square_gain, int budget_left) const;
  void scan_swaps(Candidate& best, int partners, int budget_left, const SearchLimits& limits);
  void try_retarget(Candidate& best, int slot, int expert, int budget_left, const SearchLimits& limits);
  Donor make_donor(int slot) const;
  Receiver make_receiver(int expert);
  void pair_donor(Candidate& best, const Donor& donor, const Receiver& receiver, int budget_left,
                  const SearchLimits& limits);
  void scan_new_replicas(Candidate& best, const std::vector<int>& hot, const std::vector<int>& donors,
                         int budget_left, const SearchLimits& limits);
  void apply(const Candidate& move);
  void find_cold(size_t keep);
  void scan_cold_retargets(Candidate& best, int budget_left, const SearchLimits& limits);
  void update_donor_scores();
  void rank_donors(const SearchLimits& limits);
  void collect_hot();

  std::span<const double> load_;
  int experts_, slots_, ranks_, per_rank_;
  double noise_weight_ = 0;
  std::vector<int32_t> start_, slot_expert_;
  std::vector<int> count_;
  std::vector<int> next_replica_, head_;  // singly linked replica slots per expert
  std::vector<double> slot_weight_;       // load / count of each slot's expert
  std::vector<double> expert_weight_;     // load / count of each expert
  std::vector<double> rank_load_, rank_square_, rank_score_;
  std::vector<int> order_;                // ranks by score, highest first (ties: lowest rank)
  std::vector<int> rank_of_;              // slot -> rank (no divisions in inner loops)
  std::vector<int> rank_stamp_;
  int stamp_ = 0;
  int changed_ = 0;
  double current_max_ = 0;
  // improve()'s candidates, kept between iterations.
  bool counts_changed_ = true;  // replica counts changed since the last scan
  std::vector<int> cold_, redundant_, donors_, hot_;
  std::vector<double> cold_key_, donor_score_;
  std::vector<char> expert_dirty_;  // [E] donor scores to recompute (a rank holding it changed)
  std::vector<Donor> donor_cache_;
  std::vector<int> affected_rank_;
  std::vector<double> affected_load_, affected_square_;
};

}  // namespace eplb::policies
