// Synthetic load traces: skewed expert popularity that drifts between steps.
//
// Model, per layer (layers are independent streams of one seed):
// - every expert e has a latent score u_e ~ N(0, 1);
// - between steps the scores follow a discrete Ornstein-Uhlenbeck process,
//   u_e <- (1 - drift) u_e + sqrt(1 - (1 - drift)^2) n_e with n_e ~ N(0, 1),
//   whose stationary law stays N(0, 1): the skew of the popularity is the
//   same at every step while *which* experts are hot changes (the lag-k
//   correlation of the scores is (1 - drift)^k);
// - popularity from the scores: zipf ranks the experts by score and gives the
//   k-th (0-based) weight 1 / (k + 1)^skew; lognormal gives exp(skew * u_e);
// - counts: Poisson with mean tokens_per_step * weight / sum(weights)
//   (a rounded normal approximation for means >= 30), non-negative integers.
// Scores and counts use separate streams, so changing tokens_per_step keeps
// the same popularity path. All arithmetic is in double from our own PRNG;
// std::exp/log/cos come from the C library, and since counts are rounded to
// integers, last-bit differences between libm versions can only matter at
// exact rounding ties.
#include <fmt/format.h>
#include <algorithm>
#include <cmath>
#include <numeric>
#include <string>

#include "eplb/sim.h"
#include "random.h"

namespace eplb {
namespace {

// Per-step drift of the latent popularity scores (see the model above),
// tuned by the policies work (docs/policies-migration-aware.md): with 0.001
// a deepseek placement fitted on one 20-step window of the standard
// lognormal trace loses about 9 points of balancedness on the next (>= 8 on
// every window; 0.0005 loses 6, 0.05 loses 37). Change it only here.
constexpr double kDefaultDrift = 0.001;

// Default tokens routed per layer per step: a batch of 4096 tokens, top-8.
constexpr double kDefaultTokensPerStep = 4096.0 * 8.0;

// Upper bound on steps x layers x experts (2 GiB of doubles).
constexpr uint64_t kMaxValues = uint64_t(1) << 28;

uint64_t stream_seed(uint64_t seed, int layer, uint64_t stream) {
  return sim::mix64(sim::mix64(seed ^ 0x6570'6C62'6C6F'6164ull) + uint64_t(uint32_t(layer)) * sim::kGolden +
                    stream);
}

}  // namespace

double default_drift() { return kDefaultDrift; }

Result<LoadTrace> generate_load_trace(const LoadGenOptions& options) {
  auto bad = [](const std::string& what) { return error(Code::InvalidArgument, "gen-load: " + what); };
  if (options.num_layers <= 0) return bad(fmt::format("layers must be > 0, got {}", options.num_layers));
  if (options.num_experts <= 0) return bad(fmt::format("experts must be > 0, got {}", options.num_experts));
  if (options.num_steps <= 0) return bad(fmt::format("steps must be > 0, got {}", options.num_steps));
  if (uint64_t(options.num_steps) * uint64_t(options.num_layers) * uint64_t(options.num_experts) > kMaxValues)
    return bad("steps x layers x experts must stay below 2^28");
  if (!std::isfinite(options.skew) || options.skew < 0 || options.skew > 100)
    return bad(fmt::format("skew must be in [0, 100], got {}", options.skew));
  double drift = options.drift < 0 ? default_drift() : options.drift;
  if (!std::isfinite(drift) || drift > 1) return bad(fmt::format("drift must be in [0, 1], got {}", drift));
  double tokens = options.tokens_per_step == 0 ? kDefaultTokensPerStep : options.tokens_per_step;
  if (!std::isfinite(tokens) || tokens < 0 || tokens > 1e15)
    return bad(fmt::format("tokens per step must be in [0, 1e15], got {}", tokens));

  LoadTrace trace;
  trace.num_steps = options.num_steps;
  trace.num_layers = options.num_layers;
  trace.num_experts = options.num_experts;
  const size_t experts = size_t(options.num_experts);
  trace.values.assign(size_t(options.num_steps) * size_t(options.num_layers) * experts, 0.0);

  const bool zipf = options.distribution == LoadDistribution::Zipf;
  std::vector<double> rank_weight(experts);
  for (size_t k = 0; k < experts; ++k) rank_weight[k] = std::pow(double(k + 1), -options.skew);
  const double keep = 1.0 - drift;
  const double innovation = std::sqrt(std::max(0.0, 1.0 - keep * keep));

  std::vector<double> score(experts), weight(experts);
  std::vector<uint32_t> order(experts);
  for (int layer = 0; layer < options.num_layers; ++layer) {
    sim::Rng latent(stream_seed(options.seed, layer, 0));
    sim::Rng noise(stream_seed(options.seed, layer, 1));
    for (double& u : score) u = latent.normal();
    for (int step = 0; step < options.num_steps; ++step) {
      if (step > 0 && drift > 0)
        for (double& u : score) u = keep * u + innovation * latent.normal();
      if (zipf) {
        std::iota(order.begin(), order.end(), 0u);
        std::sort(order.begin(), order.end(), [&](uint32_t a, uint32_t b) {
          return score[a] > score[b] || (score[a] == score[b] && a < b);
        });
        for (size_t k = 0; k < experts; ++k) weight[order[k]] = rank_weight[k];
      } else {
        double top = *std::max_element(score.begin(), score.end());
        for (size_t e = 0; e < experts; ++e) weight[e] = std::exp(options.skew * (score[e] - top));
      }
      double total = 0;
      for (double w : weight) total += w;
      double* out = trace.values.data() + (size_t(step) * size_t(options.num_layers) + size_t(layer)) * experts;
      for (size_t e = 0; e < experts; ++e) out[e] = noise.poisson(tokens * weight[e] / total);
    }
  }
  return trace;
}

}  // namespace eplb
