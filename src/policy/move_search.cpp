#include "move_search.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <tuple>

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
      slot_weight_(size_t(slots_), 0.0),
      expert_weight_(size_t(experts_), 0.0),
      rank_load_(size_t(ranks_), 0.0),
      rank_square_(size_t(ranks_), 0.0),
      rank_score_(size_t(ranks_), 0.0),
      order_(size_t(ranks_)),
      rank_of_(size_t(slots_)),
      rank_stamp_(size_t(ranks_), 0),
      donor_score_(size_t(slots_)),

      expert_dirty_(size_t(experts_), 1),
      affected_rank_(size_t(slots_) + 1),
      affected_load_(size_t(slots_) + 1),
      affected_square_(size_t(slots_) + 1) {
  for (int s = 0; s < slots_; ++s) rank_of_[size_t(s)] = s / per_rank_;
  for (int s = slots_ - 1; s >= 0; --s) {
    int e = slot_expert_[size_t(s)];
    ++count_[size_t(e)];
    next_replica_[size_t(s)] = head_[size_t(e)];
    head_[size_t(e)] = s;
  }
}

double LayerSearch::score(double load, double square) const {
  return noise_weight_ > 0 ? load + noise_weight_ * std::sqrt(std::max(square, 0.0)) : load;
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
  for (int e = 0; e < experts_; ++e) expert_weight_[size_t(e)] = weight(e);
  std::fill(rank_load_.begin(), rank_load_.end(), 0.0);
  std::fill(rank_square_.begin(), rank_square_.end(), 0.0);
  for (int s = 0; s < slots_; ++s) {
    double w = expert_weight_[size_t(slot_expert_[size_t(s)])];
    slot_weight_[size_t(s)] = w;
    rank_load_[size_t(rank_of_[size_t(s)])] += w;
    rank_square_[size_t(rank_of_[size_t(s)])] += w * w;
  }
  for (int r = 0; r < ranks_; ++r) rank_score_[size_t(r)] = score(rank_load_[size_t(r)], rank_square_[size_t(r)]);
  std::iota(order_.begin(), order_.end(), 0);
  sort_ranks();
}

void LayerSearch::sort_ranks() {
  // Insertion sort: after one move the order is almost right already.
  auto before = [&](int a, int b) {
    double sa = rank_score_[size_t(a)], sb = rank_score_[size_t(b)];
    return sa != sb ? sa > sb : a < b;
  };
  for (size_t i = 1; i < order_.size(); ++i) {
    int r = order_[i];
    size_t j = i;
    for (; j > 0 && before(r, order_[j - 1]); --j) order_[j] = order_[j - 1];
    order_[j] = r;
  }
  current_max_ = rank_score_[size_t(order_[0])];
}

void LayerSearch::reweigh(int expert) {
  const double w = weight(expert);
  expert_weight_[size_t(expert)] = w;
  for (int t = head_[size_t(expert)]; t >= 0; t = next_replica_[size_t(t)]) {
    const size_t r = size_t(rank_of_[size_t(t)]);
    const double old = slot_weight_[size_t(t)];
    rank_load_[r] += w - old;
    rank_square_[r] += w * w - old * old;
    rank_score_[r] = score(rank_load_[r], rank_square_[r]);
    slot_weight_[size_t(t)] = w;
  }
}

double LayerSearch::max_load() const {
  std::vector<double> loads(size_t(ranks_), 0.0);
  for (int s = 0; s < slots_; ++s) loads[size_t(rank_of_[size_t(s)])] += weight(slot_expert_[size_t(s)]);
  return *std::max_element(loads.begin(), loads.end());
}

double LayerSearch::heaviest_other(const int* ranks, int count) const {
  for (int r : order_)
    if (std::find(ranks, ranks + count, r) == ranks + count) return rank_score_[size_t(r)];
  return 0.0;
}

bool LayerSearch::acceptable(double gain, double square_gain, const SearchLimits& limits) const {
  const double eps = 1e-9 * current_max_;
  if (gain > eps && gain > limits.min_relative_gain * current_max_) return true;
  return limits.accept_plateau && gain >= 0 && square_gain > eps * current_max_;
}

inline void LayerSearch::consider(Candidate& best, Candidate candidate, double gain, double square_gain,
                                  int budget_left) const {
  if (candidate.cost > budget_left) return;
  const double eps = 1e-9 * current_max_;
  const double per_slot = candidate.cost > 0 ? double(candidate.cost) : 0.5;
  candidate.key_gain = gain > eps ? gain / per_slot : 0.0;  // plateau moves rank below any real gain
  candidate.key_square = square_gain / per_slot;
  if (best.kind == 0 || candidate.key_gain > best.key_gain ||
      (candidate.key_gain == best.key_gain && candidate.key_square > best.key_square))
    best = candidate;
}

void LayerSearch::scan_swaps(Candidate& best, int partners, int budget_left, const SearchLimits& limits) {
  const int heavy = order_[0];
  const double heavy_load = rank_load_[size_t(heavy)], heavy_square = rank_square_[size_t(heavy)];
  const double heavy_score = rank_score_[size_t(heavy)];
  const double gain_floor = std::max(1e-9 * current_max_, limits.min_relative_gain * current_max_);
  for (int p = 0; p < partners; ++p) {
    const int light = order_[size_t(ranks_ - 1 - p)];
    if (light == heavy) continue;
    const double light_load = rank_load_[size_t(light)], light_square = rank_square_[size_t(light)];
    const double light_score = rank_score_[size_t(light)];
    const int pair[2] = {heavy, light};
    const double rest = heaviest_other(pair, 2);
    if (!limits.accept_plateau && current_max_ - rest <= gain_floor) continue;  // another rank is as high
    for (int i = 0; i < per_rank_; ++i) {
      const int a = heavy * per_rank_ + i;
      const double wa = slot_weight_[size_t(a)];
      for (int j = 0; j < per_rank_; ++j) {
        const int b = light * per_rank_ + j;
        const double wb = slot_weight_[size_t(b)];
        if (wa <= wb) continue;  // must lighten the heavy rank (also skips equal experts)
        const int ea = slot_expert_[size_t(a)], eb = slot_expert_[size_t(b)];
        const int cost = cost_of(a, eb) + cost_of(b, ea);
        if (cost > budget_left) continue;  // consider() would refuse it: checked first, it is cheap
        const double delta = wa - wb, delta_square = wa * wa - wb * wb;
        const double sa = score(heavy_load - delta, heavy_square - delta_square);
        if (limits.accept_plateau ? sa > current_max_ : current_max_ - sa <= gain_floor) continue;
        const double sb = score(light_load + delta, light_square + delta_square);
        const double gain = current_max_ - std::max(std::max(sa, sb), rest);
        const double square_gain = heavy_score * heavy_score + light_score * light_score - sa * sa - sb * sb;
        if (!acceptable(gain, square_gain, limits)) continue;
        if (ea == eb) continue;
        if (limits.anti_affinity && (rank_holds(heavy, eb) || rank_holds(light, ea))) continue;
        consider(best, Candidate{1, a, b, 0, 0, cost}, gain, square_gain, budget_left);
      }
    }
  }
}

void LayerSearch::try_retarget(Candidate& best, int slot, int expert, int budget_left, const SearchLimits& limits) {
  const int old_expert = slot_expert_[size_t(slot)];
  if (old_expert == expert || count_[size_t(old_expert)] < 2) return;
  const int rank = rank_of_[size_t(slot)];
  if (limits.anti_affinity && rank_holds(rank, expert)) return;
  const int cost = cost_of(slot, expert);
  if (cost > budget_left) return;
  int* ranks = affected_rank_.data();
  double* load_delta = affected_load_.data();
  double* square_delta = affected_square_.data();
  int affected = 0;
  auto add = [&](int r, double delta, double delta_square) {
    for (int i = 0; i < affected; ++i)
      if (ranks[i] == r) {
        load_delta[i] += delta;
        square_delta[i] += delta_square;
        return;
      }
    ranks[affected] = r;
    load_delta[affected] = delta;
    square_delta[affected++] = delta_square;
  };
  const double c_old = expert_weight_[size_t(old_expert)];
  const double c_new = load_[size_t(old_expert)] / (count_[size_t(old_expert)] - 1);
  const double h_old = expert_weight_[size_t(expert)];
  const double h_new = load_[size_t(expert)] / (count_[size_t(expert)] + 1);
  add(rank, h_new - c_old, h_new * h_new - c_old * c_old);
  for (int t = head_[size_t(old_expert)]; t >= 0; t = next_replica_[size_t(t)])
    if (t != slot) add(rank_of_[size_t(t)], c_new - c_old, c_new * c_new - c_old * c_old);
  for (int t = head_[size_t(expert)]; t >= 0; t = next_replica_[size_t(t)])
    add(rank_of_[size_t(t)], h_new - h_old, h_new * h_new - h_old * h_old);
  double new_max = heaviest_other(ranks, affected), square_gain = 0;
  for (int i = 0; i < affected; ++i) {
    const size_t r = size_t(ranks[i]);
    const double before = rank_score_[r];
    const double after = score(rank_load_[r] + load_delta[i], rank_square_[r] + square_delta[i]);
    new_max = std::max(new_max, after);
    square_gain += before * before - after * after;
  }
  const double gain = current_max_ - new_max;
  if (acceptable(gain, square_gain, limits))
    consider(best, Candidate{2, slot, expert, 0, 0, cost}, gain, square_gain, budget_left);
}

// The donor side of a new-replica move (slot s gives up its expert c): s's
// rank loses c's replica and c's other replicas get heavier.
LayerSearch::Donor LayerSearch::make_donor(int s) const {
  Donor d{};
  d.slot = s;
  d.expert = slot_expert_[size_t(s)];
  d.rank = rank_of_[size_t(s)];
  const double c_old = expert_weight_[size_t(d.expert)];
  const double c_new = load_[size_t(d.expert)] / (count_[size_t(d.expert)] - 1);
  d.rank_load_after = rank_load_[size_t(d.rank)] - c_old;
  d.rank_square_after = rank_square_[size_t(d.rank)] - c_old * c_old;
  d.ranks[d.num_ranks++] = d.rank;
  d.simple = true;
  // Sibling replicas, merged per rank (a sibling on s's own rank folds into rank_*_after).
  double sibling_load[8] = {}, sibling_square[8] = {};
  for (int t = head_[size_t(d.expert)]; t >= 0 && d.simple; t = next_replica_[size_t(t)]) {
    if (t == s) continue;
    const int r = rank_of_[size_t(t)];
    if (r == d.rank) {
      d.rank_load_after += c_new - c_old;
      d.rank_square_after += c_new * c_new - c_old * c_old;
      continue;
    }
    int i = 1;
    while (i < d.num_ranks && d.ranks[i] != r) ++i;
    if (i == d.num_ranks) {
      if (d.num_ranks == 8) {
        d.simple = false;
        break;
      }
      d.ranks[d.num_ranks++] = r;
    }
    sibling_load[i] += c_new - c_old;
    sibling_square[i] += c_new * c_new - c_old * c_old;
  }
  for (int i = 1; i < d.num_ranks; ++i) {
    const size_t r = size_t(d.ranks[i]);
    const double before = rank_score_[r];
    const double after = score(rank_load_[r] + sibling_load[i], rank_square_[r] + sibling_square[i]);
    d.sibling_peak = std::max(d.sibling_peak, after);
    d.sibling_square += before * before - after * after;
  }
  return d;
}

// The receiving side of a new replica of h: every replica of h gets lighter.
// Stamps h's ranks; `simple` is false when two replicas share a rank.
LayerSearch::Receiver LayerSearch::make_receiver(int h) {
  Receiver out{h, expert_weight_[size_t(h)], load_[size_t(h)] / (count_[size_t(h)] + 1), 0, 0, true};
  ++stamp_;
  for (int t = head_[size_t(h)]; t >= 0; t = next_replica_[size_t(t)]) {
    const int r = rank_of_[size_t(t)];
    if (rank_stamp_[size_t(r)] == stamp_) out.simple = false;
    rank_stamp_[size_t(r)] = stamp_;
    const double before = rank_score_[size_t(r)];
    const double after = score(rank_load_[size_t(r)] + out.weight_after - out.weight_before,
                               rank_square_[size_t(r)] + out.weight_after * out.weight_after -
                                   out.weight_before * out.weight_before);
    out.peak = std::max(out.peak, after);
    out.square_gain += before * before - after * after;
  }
  return out;
}

// One donor slot receiving a replica of the receiver's expert (ranks of
// both sides disjoint: the two sides add up; else evaluated exactly).
void LayerSearch::pair_donor(Candidate& best, const Donor& d, const Receiver& h, int budget_left,
                             const SearchLimits& limits) {
  if (d.expert == h.expert) return;
  bool shared = !h.simple || !d.simple;
  for (int i = 0; i < d.num_ranks && !shared; ++i) shared = rank_stamp_[size_t(d.ranks[i])] == stamp_;
  if (shared) {
    try_retarget(best, d.slot, h.expert, budget_left, limits);
    return;
  }
  if (limits.anti_affinity && rank_holds(d.rank, h.expert)) return;
  const double rank_before = rank_score_[size_t(d.rank)];
  const double rank_after = score(d.rank_load_after + h.weight_after, d.rank_square_after + h.weight_after * h.weight_after);
  double new_max = std::max({h.peak, d.sibling_peak, rank_after});
  for (int r : order_) {  // the top rank the move does not touch
    if (rank_stamp_[size_t(r)] == stamp_ || std::find(d.ranks, d.ranks + d.num_ranks, r) != d.ranks + d.num_ranks)
      continue;
    new_max = std::max(new_max, rank_score_[size_t(r)]);
    break;
  }
  const double gain = current_max_ - new_max;
  const double square_gain = h.square_gain + d.sibling_square + rank_before * rank_before - rank_after * rank_after;
  if (!acceptable(gain, square_gain, limits)) return;
  consider(best, Candidate{2, d.slot, h.expert, 0, 0, cost_of(d.slot, h.expert)}, gain, square_gain, budget_left);
}

void LayerSearch::scan_new_replicas(Candidate& best, const std::vector<int>& hot, const std::vector<int>& donors,
                                    int budget_left, const SearchLimits& limits) {
  donor_cache_.clear();
  for (int s : donors) donor_cache_.push_back(make_donor(s));  // once per donor, not per pair
  for (int h : hot) {
    const Receiver receiver = make_receiver(h);
    for (const Donor& d : donor_cache_) pair_donor(best, d, receiver, budget_left, limits);
  }
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
    const int a = move.slot, b = move.other;
    const int ea = slot_expert_[size_t(a)], eb = slot_expert_[size_t(b)];
    changed_ -= changed(a) + changed(b);
    unlink(ea, a);
    unlink(eb, b);
    slot_expert_[size_t(a)] = eb;
    slot_expert_[size_t(b)] = ea;
    link(eb, a);
    link(ea, b);
    changed_ += changed(a) + changed(b);
    const double wa = slot_weight_[size_t(a)], wb = slot_weight_[size_t(b)];
    for (auto [slot, gone, come] : {std::tuple{a, wa, wb}, std::tuple{b, wb, wa}}) {
      const size_t r = size_t(rank_of_[size_t(slot)]);
      rank_load_[r] += come - gone;
      rank_square_[r] += come * come - gone * gone;
      rank_score_[r] = score(rank_load_[r], rank_square_[r]);
      slot_weight_[size_t(slot)] = come;
      // Every expert on this rank has new donor scores (a and b's experts included).
      const int32_t* on_rank = slot_expert_.data() + r * size_t(per_rank_);
      for (int i = 0; i < per_rank_; ++i) expert_dirty_[size_t(on_rank[i])] = 1;
    }
  } else if (move.kind == 2) {
    const int s = move.slot, h = move.other, c = slot_expert_[size_t(s)];
    changed_ -= changed(s);
    unlink(c, s);
    --count_[size_t(c)];
    slot_expert_[size_t(s)] = h;
    link(h, s);
    ++count_[size_t(h)];
    changed_ += changed(s);
    reweigh(c);
    reweigh(h);  // includes slot s, whose slot weight was still c's
  }
  sort_ranks();
}

// The coldest experts by load / (count + 1) (ties: lower index): the
// retarget targets; they change only with the replica counts.
void LayerSearch::find_cold(size_t keep) {
  cold_.resize(size_t(experts_));
  cold_key_.resize(size_t(experts_));
  std::iota(cold_.begin(), cold_.end(), 0);
  for (int e = 0; e < experts_; ++e) cold_key_[size_t(e)] = load_[size_t(e)] / (count_[size_t(e)] + 1);
  std::partial_sort(cold_.begin(), cold_.begin() + ptrdiff_t(keep), cold_.end(), [&](int a, int b) {
    return cold_key_[size_t(a)] != cold_key_[size_t(b)] ? cold_key_[size_t(a)] < cold_key_[size_t(b)] : a < b;
  });
}

// Redundant replicas on the top rank -> the coldest experts.
void LayerSearch::scan_cold_retargets(Candidate& best, int budget_left, const SearchLimits& limits) {
  const size_t keep_cold = std::min<size_t>(size_t(std::max(limits.cold_candidates, 0)), size_t(experts_));
  if (keep_cold == 0) return;
  if (counts_changed_) find_cold(keep_cold);
  const int first = order_[0] * per_rank_;
  for (int i = 0; i < per_rank_; ++i)
    if (count_[size_t(slot_expert_[size_t(first + i)])] >= 2)
      for (size_t k = 0; k < keep_cold; ++k) try_retarget(best, first + i, cold_[k], budget_left, limits);
}

// Each replica t of an expert c with >= 2 replicas, as a donor: the larger
// of its rank's score without it and the scores c's siblings would reach.
// Recomputed only for experts marked dirty (one of their ranks changed),
// or for all after a change of replica counts.
void LayerSearch::update_donor_scores() {
  if (counts_changed_) {
    redundant_.clear();
    for (int c = 0; c < experts_; ++c)
      if (count_[size_t(c)] >= 2) redundant_.push_back(c);
    std::fill(expert_dirty_.begin(), expert_dirty_.end(), 1);
  }
  for (int c : redundant_) {
    if (!expert_dirty_[size_t(c)]) continue;
    expert_dirty_[size_t(c)] = 0;
    const double c_old = expert_weight_[size_t(c)], c_new = load_[size_t(c)] / (count_[size_t(c)] - 1);
    double sibling_peak[2] = {0, 0};  // the two largest sibling scores after
    int peak_slot = -1;
    for (int t = head_[size_t(c)]; t >= 0; t = next_replica_[size_t(t)]) {
      const size_t r = size_t(rank_of_[size_t(t)]);
      const double v = score(rank_load_[r] + c_new - c_old, rank_square_[r] + c_new * c_new - c_old * c_old);
      if (v > sibling_peak[0]) {
        sibling_peak[1] = sibling_peak[0];
        sibling_peak[0] = v;
        peak_slot = t;
      } else if (v > sibling_peak[1]) {
        sibling_peak[1] = v;
      }
    }
    for (int t = head_[size_t(c)]; t >= 0; t = next_replica_[size_t(t)]) {
      const size_t r = size_t(rank_of_[size_t(t)]);
      const double others = t == peak_slot ? sibling_peak[1] : sibling_peak[0];
      donor_score_[size_t(t)] = std::max(score(rank_load_[r] - c_old, rank_square_[r] - c_old * c_old), others);
    }
  }
}

// The best donor slots: lowest donor score, then lowest slot.
void LayerSearch::rank_donors(const SearchLimits& limits) {
  update_donor_scores();
  donors_.clear();
  for (int c : redundant_)
    for (int t = head_[size_t(c)]; t >= 0; t = next_replica_[size_t(t)]) donors_.push_back(t);
  const size_t keep = std::min<size_t>(size_t(std::max(limits.donor_candidates, 0)), donors_.size());
  std::partial_sort(donors_.begin(), donors_.begin() + ptrdiff_t(keep), donors_.end(), [&](int a, int b) {
    return donor_score_[size_t(a)] != donor_score_[size_t(b)] ? donor_score_[size_t(a)] < donor_score_[size_t(b)]
                                                              : a < b;
  });
  donors_.resize(keep);
}

// The top rank's experts, each once.
void LayerSearch::collect_hot() {
  hot_.clear();
  const int first = order_[0] * per_rank_;
  for (int i = 0; i < per_rank_; ++i) {
    const int e = slot_expert_[size_t(first + i)];
    if (std::find(hot_.begin(), hot_.end(), e) == hot_.end()) hot_.push_back(e);
  }
}

int LayerSearch::improve(const SearchLimits& limits) {
  noise_weight_ = std::max(0.0, limits.noise_weight);
  refresh();
  counts_changed_ = true;
  int moves = 0;
  for (int iteration = 0; iteration < limits.max_iterations; ++iteration) {
    if (current_max_ <= 0) break;
    const int budget_left = limits.budget_slots == INT_MAX ? INT_MAX : limits.budget_slots - changed_;
    Candidate best;
    // Swaps of the top rank's slots with the lowest-scoring ranks' slots.
    scan_swaps(best, std::min(limits.swap_partner_ranks, ranks_ - 1), budget_left, limits);
    if (limits.allow_retarget && budget_left > 0) {
      scan_cold_retargets(best, budget_left, limits);
      // New replicas of the top rank's experts in the best donor slots.
      rank_donors(limits);
      collect_hot();
      scan_new_replicas(best, hot_, donors_, budget_left, limits);
      counts_changed_ = false;
    }
    if (best.kind == 0) break;
    counts_changed_ |= best.kind == 2;
    apply(best);
    ++moves;
  }
  return moves;
}

}  // namespace eplb::policies
