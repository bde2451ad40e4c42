// The `cost-aware` policy (docs/scale.md): per layer, a menu of candidates
// (cost_candidates.h) priced on the cluster; then the choice, one candidate
// per layer, that maximizes the tokens served until the next rebalance net
// of the migration's stall (eplb/cluster.h, tokens_served), with the step
// time set by the most loaded rank: sum over layers of the expected max
// rank load on the next window (layer_tools.h layer_expected_max_load: each
// expert's load off by a relative sigma = 10%, the error incremental's
// noise-aware rank score assumes).
//
// The choice: tokens J(M, S, sum of scores) depend on the layers only
// through three sums (migration seconds M, stall S, scores). Starting from
// "keep every layer", each layer takes the candidate with the best
// linearized gain at the current sums; the new choice is kept while J
// grows (at most 32 passes). Deterministic; layers in parallel.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "balanced.h"
#include "cost_candidates.h"
#include "eplb/common.h"
#include "layer_tools.h"
#include "policies.h"
#include "relabel.h"

namespace eplb::policies {

namespace {

constexpr double kNoiseWeight = 0.2;  // incremental's rank-score weight (incremental.cpp): 2 sigma ahead
constexpr double kLoadSigma = 0.1;    // the relative error of a next-window expert load that weight assumes
constexpr int kPasses = 32;

struct Totals {
  double migration = 0, stall = 0, score = 0;
};

double stall_of(const LayerPrice& price, StallMode mode) {
  switch (mode) {
    case StallMode::Sync: return price.seconds;
    case StallMode::AsyncCopy: return price.stall_copy;
    case StallMode::AsyncSwap: return price.stall_swap;
  }
  return price.seconds;
}

class Chooser {
 public:
  Chooser(const std::vector<std::vector<LayerCandidate>>& menus, const ServingModel& serving, double mean_total)
      : menus_(menus), serving_(serving), mean_total_(mean_total), choice_(menus.size(), 0) {}

  std::vector<size_t> choose() {
    double best = value(totals(choice_));
    for (int pass = 0; pass < kPasses; ++pass) {
      std::vector<size_t> next = linearized_choice(totals(choice_));
      const double candidate = value(totals(next));
      if (!(candidate > best * (1 + 1e-12)) || next == choice_) break;
      best = candidate;
      choice_ = std::move(next);
    }
    return choice_;
  }

 private:
  Totals totals(const std::vector<size_t>& choice) const {
    Totals t;
    for (size_t l = 0; l < menus_.size(); ++l) {
      const LayerCandidate& c = menus_[l][choice[l]];
      t.migration += c.price.seconds;
      t.stall += stall_of(c.price, serving_.mode);
      t.score += c.score;
    }
    return t;
  }
  double keep_score() const {
    double total = 0;
    for (const auto& menu : menus_) total += menu.front().score;
    return total;
  }
  // Tokens until the next rebalance, up to the constant rate factor.
  double value(const Totals& t) const {
    if (t.score <= 0) return 0;
    return tokens_served(serving_, mean_total_ / keep_score(), mean_total_ / t.score, t.migration, t.stall);
  }
  std::vector<size_t> linearized_choice(const Totals& t) const {
    // Partial derivatives of value() in the three sums, by central differences.
    const double h_score = 1e-6 * std::max(t.score, 1e-300), h_time = 1e-6 * serving_.interval_seconds;
    auto at = [&](double dm, double ds, double dx) { return value({t.migration + dm, t.stall + ds, t.score + dx}); };
    const double d_score = (at(0, 0, h_score) - at(0, 0, -h_score)) / (2 * h_score);
    const double d_migration = (at(h_time, 0, 0) - at(-h_time, 0, 0)) / (2 * h_time);
    const double d_stall = (at(0, h_time, 0) - at(0, -h_time, 0)) / (2 * h_time);
    std::vector<size_t> choice(menus_.size(), 0);
    for (size_t l = 0; l < menus_.size(); ++l) {
      double best = -INFINITY;
      for (size_t k = 0; k < menus_[l].size(); ++k) {
        const LayerCandidate& c = menus_[l][k];
        const double gain = d_score * c.score + d_migration * c.price.seconds + d_stall * stall_of(c.price, serving_.mode);
        if (gain > best) {
          best = gain;
          choice[l] = k;
        }
      }
    }
    return choice;
  }

  const std::vector<std::vector<LayerCandidate>>& menus_;
  const ServingModel serving_;
  const double mean_total_;
  std::vector<size_t> choice_;
};

Result<CandidateSettings> settings_for(const PolicyOptions& options) {
  CandidateSettings settings;
  EPLB_ASSIGN_OR_RETURN(settings.cluster, cluster_preset(options.cluster));
  if (!(std::isfinite(options.bytes_per_expert) && options.bytes_per_expert > 0))
    return error(Code::InvalidArgument,
                 fmt::format("cost-aware: bytes per expert must be finite and > 0, got {}", options.bytes_per_expert));
  settings.bytes_per_expert = options.bytes_per_expert;
  settings.noise_weight = kNoiseWeight;
  settings.load_sigma = kLoadSigma;
  return settings;
}

Result<ServingModel> serving_for(const PolicyOptions& options) {
  ServingModel serving;
  serving.interval_seconds = options.interval_seconds;
  EPLB_ASSIGN_OR_RETURN(serving.mode, parse_stall_mode(options.stall_mode));
  EPLB_TRY(serving.validate().with_context("cost-aware"));
  return serving;
}

// Two full refits of every layer, relabelled onto the placement in force:
// `balanced`'s layer and deepseek's. [L][R] each.
struct Refits {
  std::vector<int32_t> balanced, deepseek;
};

Result<Refits> refits(const LoadMatrix& load, const Topology& topology, const Placement& current, int threads) {
  EPLB_ASSIGN_OR_RETURN(Placement start, deepseek_placement(load, topology, threads));
  const size_t slots = size_t(topology.num_slots);
  Refits out;
  out.balanced.resize(size_t(topology.num_layers) * slots);
  out.deepseek.resize(out.balanced.size());
  parallel_for(size_t(topology.num_layers), threads, [&](size_t l) {
    std::vector<int32_t> fresh =
        balance_layer(load.layer(int(l)), topology, start.layer_phy2log(int(l)), false, BalanceSettings{});
    std::vector<int32_t> kept = relabel_layer(fresh, current.layer_phy2log(int(l)), topology, false);
    std::copy(kept.begin(), kept.end(), out.balanced.begin() + l * slots);
    kept = relabel_layer(start.layer_phy2log(int(l)), current.layer_phy2log(int(l)), topology, false);
    std::copy(kept.begin(), kept.end(), out.deepseek.begin() + l * slots);
  });
  return out;
}

class CostAwarePolicy final : public Policy {
 public:
  std::string name() const override { return "cost-aware"; }

  Result<Placement> place(const LoadMatrix& load, const Topology& topology, const Placement& current,
                          const PolicyOptions& options) const override {
    EPLB_TRY(check_load(load, topology));
    EPLB_TRY(check_current(current, topology));
    if (options.anti_affinity)
      return error(Code::InvalidArgument, "cost-aware does not take --anti-affinity (its candidates do not keep it)");
    EPLB_ASSIGN_OR_RETURN(CandidateSettings settings, settings_for(options));
    EPLB_ASSIGN_OR_RETURN(ServingModel serving, serving_for(options));
    EPLB_ASSIGN_OR_RETURN(Refits full, refits(load, topology, current, options.threads));
    const size_t slots = size_t(topology.num_slots);
    std::vector<std::vector<LayerCandidate>> menus(size_t(topology.num_layers));
    parallel_for(size_t(topology.num_layers), options.threads, [&](size_t l) {
      menus[l] = layer_candidates(load.layer(int(l)), topology, int(l), current.layer_phy2log(int(l)),
                                  {std::span<const int32_t>(full.balanced.data() + l * slots, slots),
                                   std::span<const int32_t>(full.deepseek.data() + l * slots, slots)},
                                  settings);
    });
    double mean_total = 0;  // sum over layers of the mean rank load
    for (double value : load.values) mean_total += value;
    mean_total /= topology.num_ranks;
    const std::vector<size_t> choice = Chooser(menus, serving, mean_total).choose();
    std::vector<int32_t> phy2log(size_t(topology.num_layers) * slots);
    for (size_t l = 0; l < menus.size(); ++l)
      std::copy(menus[l][choice[l]].phy2log.begin(), menus[l][choice[l]].phy2log.end(), phy2log.begin() + l * slots);
    apply_hysteresis(phy2log, current, load, topology, options.min_gain, false);
    return placement_from_phy2log(topology, std::move(phy2log));
  }
};

}  // namespace

std::unique_ptr<Policy> make_cost_aware() { return std::make_unique<CostAwarePolicy>(); }

}  // namespace eplb::policies
