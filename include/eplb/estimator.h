// eplb/estimator.h - load estimators: what load a policy should plan for,
// from a window of per-step loads.
//
// Contract: pure and deterministic. An estimator turns steps
// [first, first + count) of a [W][L][E] trace into one [L][E] load matrix,
// scaled like a plain sum over `count` steps (so the numbers stay
// comparable between estimators):
//   sum          the plain sum of the steps;
//   ema:H        an exponential moving average with half-life H steps (the
//                newest step has weight 1, a step H steps older 1/2, ...),
//                normalized so that the weights add up to `count`;
//   robust:Z     per expert, (mean + Z * standard deviation over the steps)
//                times `count`, floored at 0: experts with bursty loads are
//                planned for more than their average (Z >= 0), or less (Z < 0);
//   auto         ema:H with the half-life chosen from the steps themselves:
//                each H in kAutoHalfLives (and the plain sum) predicts the
//                newer half of the steps from the older half (squared error
//                summed over all cells). From the longest memory down, a
//                shorter one replaces the best so far only if it cuts that
//                error by more than kAutoMargin: between near-equal
//                candidates the noise of the steps would decide, so a load
//                that does not drift keeps the plain sum. Fewer than 4
//                steps: the plain sum. It sees only the steps it is given,
//                never the window it plans for.
// Text syntax (--estimator): "sum", "ema:H" (H > 0), "robust:Z" (finite Z), "auto".
#pragma once

#include <string>
#include <string_view>

#include "eplb/placement.h"
#include "eplb/status.h"

namespace eplb {

enum class EstimatorKind { Sum, Ema, Robust, Auto };

// The half-lives (steps) `auto` chooses among, besides the plain sum.
inline constexpr double kAutoHalfLives[] = {1, 2, 4, 8, 16};
// The relative cut of the prediction error a shorter memory must bring.
inline constexpr double kAutoMargin = 0.05;

struct Estimator {
  EstimatorKind kind = EstimatorKind::Sum;
  double half_life = 0;  // ema: half-life in steps (> 0)
  double z = 0;          // robust: standard deviations above the mean

  // "sum", "ema:8", "robust:1.5", "auto" (parse_estimator reads it back).
  std::string to_string() const;
};

Result<Estimator> parse_estimator(std::string_view text);

// Estimated [L][E] load from steps [first, first + count) of the trace.
Result<LoadMatrix> estimate_load(const LoadTrace& trace, int first, int count, const Estimator& estimator);

// What `auto` resolves to on steps [first, first + count): ema:H or sum
// (any other estimator is returned as it is). Steps outside the trace, or a
// trace whose values do not match its shape: InvalidArgument.
Result<Estimator> resolve_estimator(const LoadTrace& trace, int first, int count, const Estimator& estimator);

}  // namespace eplb
