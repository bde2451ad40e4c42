#include "move_search.h"

#include <algorithm>
#include <numeric>

namespace eplb::policies {

LayerSearch::LayerSearch(std::span<const double> load, const Topology& topology, std::span<const int32_t> start)
    : load_(load),
      experts_(int(load.size())),
      slots_(int(start.size())),
      ranks_(topology.num_ranks),
      per_rank_(topology.slots_per_rank()),
      start_(start.begin(), start.end()),
      slot_expert_(start.begin(), start.end()),
      count_(size_t(experts_), 0),
      next_replica_(size_t(slots_), -1),
      head_(size_t(experts_), -1),
      rank_load_(size_t(ranks_), 0.0),
      order_(size_t(ranks_)),
      stamp_(size_t(ranks_), 0) {
  for (int s = slots_ - 1; s >= 0; --s) {
    int e = slot_expert_[size_t(s)];
    ++count_[size_t(e)];
    next_replica_[size_t(s)] = head_[size_t(e)];
    head_[size_t(e)] = s;
  }
  affected_rank_.reserve(64);
  affected_delta_.reserve(64);
}

bool LayerSearch::rank_holds(int rank, int expert) const {
  const int32_t* first = slot_expert_.data() + size_t(rank) * per_rank_;
  for (int i = 0; i < per_rank_; ++i)
    if (first[i] == expert) return true;
  return false;
}

int LayerSearch::cost_of(int slot, int new_expert) const {
  int original = start_[size_t(slot)];
  return int(original != new_expert) - int(original != slot_expert_[size_t(slot)]);
}

void LayerSearch::refresh() {
  std::fill(rank_load_.begin(), rank_load_.end(), 0.0);
  for (int s = 0; s < slots_; ++s) rank_load_[size_t(s / per_rank_)] += weight(slot_expert_[size_t(s)]);
  std::iota(order_.begin(), order_.end(), 0);
  std::sort(order_.begin(), order_.end(), [&](int a, int b) {
    if (rank_load_[size_t(a)] != rank_load_[size_t(b)]) return rank_load_[size_t(a)] > rank_load_[size_t(b)];
    return a < b;
  });
  current_max_ = rank_load_[size_t(order_[0])];
}

double LayerSearch::max_load() {
  refresh();
  return current_max_;
}

double LayerSearch::top_excluding(int stamp) const {
  for (int r : order_)
    if (stamp_[size_t(r)] != stamp) return rank_load_[size_t(r)];
  return 0.0;
}

void LayerSearch::consider(Candidate& best, const Candidate& candidate, double gain, double square_gain,
                           int budget_left, const SearchLimits& limits) const {
  if (candidate.cost > budget_left) return;
  const double eps = 1e-9 * current_max_;
  double key_gain;
  if (gain > eps && gain > limits.min_relative_gain * current_max_) {
    key_gain = gain;
  } else if (limits.accept_plateau && gain >= 0 && square_gain > eps * current_max_) {
    key_gain = 0;
  } else {
    return;
  }
  double per_slot = candidate.cost > 0 ? double(candidate.cost) : 0.5;
  key_gain /= per_slot;
  double key_square = square_gain / per_slot;
  if (best.kind == 0 || key_gain > best.key_gain || (key_gain == best.key_gain && key_square > best.key_square)) {
    best = candidate;
    best.key_gain = key_gain;
    best.key_square = key_square;
  }
}

void LayerSearch::try_swap(Candidate& best, int a, int b, int budget_left, const SearchLimits& limits) {
  const int ea = slot_expert_[size_t(a)], eb = slot_expert_[size_t(b)];
  if (ea == eb) return;
  const int ra = a / per_rank_, rb = b / per_rank_;
  const double wa = weight(ea), wb = weight(eb);
  if (wa <= wb) return;  // must lighten ra (the heavy side)
  if (limits.anti_affinity && (rank_holds(ra, eb) || rank_holds(rb, ea))) return;
  const double la = rank_load_[size_t(ra)] - wa + wb, lb = rank_load_[size_t(rb)] - wb + wa;
  ++stamp_value_;
  stamp_[size_t(ra)] = stamp_value_;
  stamp_[size_t(rb)] = stamp_value_;
  const double new_max = std::max({la, lb, top_excluding(stamp_value_)});
  const double old_a = rank_load_[size_t(ra)], old_b = rank_load_[size_t(rb)];
  Candidate candidate;
  candidate.kind = 1;
  candidate.slot = a;
  candidate.other = b;
  candidate.cost = cost_of(a, eb) + cost_of(b, ea);
  consider(best, candidate, current_max_ - new_max, old_a * old_a + old_b * old_b - la * la - lb * lb, budget_left,
           limits);
}

void LayerSearch::try_retarget(Candidate& best, int slot, int expert, int budget_left, const SearchLimits& limits) {
  const int old_expert = slot_expert_[size_t(slot)];
  if (old_expert == expert || count_[size_t(old_expert)] < 2) return;
  const int rank = slot / per_rank_;
  if (limits.anti_affinity && rank_holds(rank, expert)) return;
  Candidate candidate;
  candidate.kind = 2;
  candidate.slot = slot;
  candidate.other = expert;
  candidate.cost = cost_of(slot, expert);
  if (candidate.cost > budget_left) return;
  affected_rank_.clear();
  affected_delta_.clear();
  auto add = [&](int r, double delta) {
    for (size_t i = 0; i < affected_rank_.size(); ++i)
      if (affected_rank_[i] == r) {
        affected_delta_[i] += delta;
        return;
      }
    affected_rank_.push_back(r);
    affected_delta_.push_back(delta);
  };
  const double c_load = load_[size_t(old_expert)], h_load = load_[size_t(expert)];
  const int c_count = count_[size_t(old_expert)], h_count = count_[size_t(expert)];
  const double h_new = h_load / (h_count + 1);
  add(rank, h_new - c_load / c_count);
  const double c_increase = c_load / (c_count - 1) - c_load / c_count;
  for (int t = head_[size_t(old_expert)]; t >= 0; t = next_replica_[size_t(t)])
    if (t != slot) add(t / per_rank_, c_increase);
  const double h_decrease = h_load / h_count - h_new;
  for (int t = head_[size_t(expert)]; t >= 0; t = next_replica_[size_t(t)]) add(t / per_rank_, -h_decrease);
  ++stamp_value_;
  double new_max = 0, square_gain = 0;
  for (size_t i = 0; i < affected_rank_.size(); ++i) {
    int r = affected_rank_[i];
    stamp_[size_t(r)] = stamp_value_;
    double before = rank_load_[size_t(r)], after = before + affected_delta_[i];
    new_max = std::max(new_max, after);
    square_gain += before * before - after * after;
  }
  new_max = std::max(new_max, top_excluding(stamp_value_));
  consider(best, candidate, current_max_ - new_max, square_gain, budget_left, limits);
}

void LayerSearch::apply(const Candidate& move) {
  auto unlink = [&](int expert, int slot) {
    int* link = &head_[size_t(expert)];
    while (*link != slot) link = &next_replica_[size_t(*link)];
    *link = next_replica_[size_t(slot)];
  };
  auto link = [&](int expert, int slot) {
    next_replica_[size_t(slot)] = head_[size_t(expert)];
    head_[size_t(expert)] = slot;
  };
  auto changed = [&](int slot) { return int(start_[size_t(slot)] != slot_expert_[size_t(slot)]); };
  if (move.kind == 1) {
    int a = move.slot, b = move.other;
    int ea = slot_expert_[size_t(a)], eb = slot_expert_[size_t(b)];
    changed_ -= changed(a) + changed(b);
    unlink(ea, a);
    unlink(eb, b);
    slot_expert_[size_t(a)] = eb;
    slot_expert_[size_t(b)] = ea;
    link(eb, a);
    link(ea, b);
    changed_ += changed(a) + changed(b);
  } else if (move.kind == 2) {
    int s = move.slot, h = move.other, c = slot_expert_[size_t(s)];
    changed_ -= changed(s);
    unlink(c, s);
    --count_[size_t(c)];
    slot_expert_[size_t(s)] = h;
    link(h, s);
    ++count_[size_t(h)];
    changed_ += changed(s);
  }
}

int LayerSearch::improve(const SearchLimits& limits) {
  int moves = 0;
  std::vector<int> cold, donors, hot;
  std::vector<double> donor_score(static_cast<size_t>(slots_));
  for (int iteration = 0; iteration < limits.max_iterations; ++iteration) {
    refresh();
    if (current_max_ <= 0) break;
    const int budget_left = limits.budget_slots == INT_MAX ? INT_MAX : limits.budget_slots - changed_;
    const int heavy = order_[0];
    const int first = heavy * per_rank_;
    Candidate best;
    // Swaps of the heaviest rank's slots with the lightest ranks' slots.
    const int partners = std::min(limits.swap_partner_ranks, ranks_ - 1);
    for (int p = 0; p < partners; ++p) {
      const int light = order_[size_t(ranks_ - 1 - p)];
      for (int i = 0; i < per_rank_; ++i)
        for (int j = 0; j < per_rank_; ++j) try_swap(best, first + i, light * per_rank_ + j, budget_left, limits);
    }
    if (limits.allow_retarget && budget_left > 0) {
      // Redundant replicas on the heaviest rank -> the coldest experts.
      cold.resize(size_t(experts_));
      std::iota(cold.begin(), cold.end(), 0);
      const size_t keep_cold = std::min<size_t>(size_t(std::max(limits.cold_candidates, 0)), cold.size());
      auto colder = [&](int a, int b) {
        double wa = load_[size_t(a)] / (count_[size_t(a)] + 1), wb = load_[size_t(b)] / (count_[size_t(b)] + 1);
        return wa != wb ? wa < wb : a < b;
      };
      std::partial_sort(cold.begin(), cold.begin() + keep_cold, cold.end(), colder);
      for (int i = 0; i < per_rank_; ++i)
        for (size_t k = 0; k < keep_cold; ++k) try_retarget(best, first + i, cold[k], budget_left, limits);
      // New replicas of the heaviest rank's experts, in the best donor slots.
      donors.clear();
      for (int s = 0; s < slots_; ++s) {
        int c = slot_expert_[size_t(s)];
        if (count_[size_t(c)] < 2) continue;
        double w = weight(c), increase = load_[size_t(c)] / (count_[size_t(c)] - 1) - w;
        double score = rank_load_[size_t(s / per_rank_)] - w;
        for (int t = head_[size_t(c)]; t >= 0; t = next_replica_[size_t(t)])
          if (t != s) score = std::max(score, rank_load_[size_t(t / per_rank_)] + increase);
        donor_score[size_t(s)] = score;
        donors.push_back(s);
      }
      const size_t keep_donors = std::min<size_t>(size_t(std::max(limits.donor_candidates, 0)), donors.size());
      std::partial_sort(donors.begin(), donors.begin() + keep_donors, donors.end(), [&](int a, int b) {
        return donor_score[size_t(a)] != donor_score[size_t(b)] ? donor_score[size_t(a)] < donor_score[size_t(b)]
                                                                : a < b;
      });
      hot.clear();
      for (int i = 0; i < per_rank_; ++i) {
        int e = slot_expert_[size_t(first + i)];
        if (std::find(hot.begin(), hot.end(), e) == hot.end()) hot.push_back(e);
      }
      for (int h : hot)
        for (size_t k = 0; k < keep_donors; ++k) try_retarget(best, donors[k], h, budget_left, limits);
    }
    if (best.kind == 0) break;
    apply(best);
    ++moves;
  }
  return moves;
}

}  // namespace eplb::policies
