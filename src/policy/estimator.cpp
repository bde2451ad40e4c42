#include "eplb/estimator.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

namespace eplb {

namespace {

std::string format_number(double value) {
  char buffer[32];
  std::snprintf(buffer, sizeof buffer, "%g", value);
  return buffer;
}

Result<double> parse_number(std::string_view text, std::string_view what) {
  std::string copy(text);
  char* end = nullptr;
  double value = std::strtod(copy.c_str(), &end);
  if (copy.empty() || end != copy.c_str() + copy.size() || !std::isfinite(value))
    return error(Code::InvalidArgument, "estimator: " + std::string(what) + " '" + copy + "' is not a finite number");
  return value;
}

}  // namespace

std::string Estimator::to_string() const {
  switch (kind) {
    case EstimatorKind::Sum: return "sum";
    case EstimatorKind::Ema: return "ema:" + format_number(half_life);
    case EstimatorKind::Robust: return "robust:" + format_number(z);
    case EstimatorKind::Auto: return "auto";
  }
  return "sum";
}

Result<Estimator> parse_estimator(std::string_view text) {
  Estimator estimator;
  std::string_view name = text.substr(0, text.find(':'));
  bool has_argument = name.size() < text.size();
  std::string_view argument = has_argument ? text.substr(name.size() + 1) : std::string_view();
  if (name == "sum" && !has_argument) return estimator;
  if (name == "auto" && !has_argument) {
    estimator.kind = EstimatorKind::Auto;
    return estimator;
  }
  if (name == "ema" && has_argument) {
    EPLB_ASSIGN_OR_RETURN(double half_life, parse_number(argument, "half-life"));
    if (!(half_life > 0)) return error(Code::InvalidArgument, "estimator: ema half-life must be > 0 steps");
    estimator.kind = EstimatorKind::Ema;
    estimator.half_life = half_life;
    return estimator;
  }
  if (name == "robust" && has_argument) {
    EPLB_ASSIGN_OR_RETURN(double z, parse_number(argument, "z"));
    estimator.kind = EstimatorKind::Robust;
    estimator.z = z;
    return estimator;
  }
  return error(Code::InvalidArgument,
               "unknown estimator '" + std::string(text) + "' (expected sum, ema:HALF_LIFE, robust:Z or auto)");
}

namespace {

const double* step_values(const LoadTrace& trace, int step) {
  return trace.values.data() + size_t(step) * size_t(trace.num_layers) * size_t(trace.num_experts);
}

// Weighted sum of steps [first, first + count), the newest step weighted 1
// and one `half_life` steps older 1/2 (infinite: the plain sum), scaled so
// that the weights add up to `count`.
LoadMatrix weighted_sum(const LoadTrace& trace, int first, int count, double half_life) {
  LoadMatrix result(trace.num_layers, trace.num_experts);
  double total_weight = 0;
  for (int s = first; s < first + count; ++s) {
    const double weight = std::isinf(half_life) ? 1.0 : std::exp2(-double(first + count - 1 - s) / half_life);
    total_weight += weight;
    const double* values = step_values(trace, s);
    for (size_t i = 0; i < result.values.size(); ++i) result.values[i] += weight * values[i];
  }
  const double scale = count / total_weight;
  for (double& v : result.values) v *= scale;
  return result;
}

LoadMatrix robust_load(const LoadTrace& trace, int first, int count, double z) {
  const LoadMatrix mean_sum = weighted_sum(trace, first, count, INFINITY);
  LoadMatrix result(trace.num_layers, trace.num_experts);
  std::vector<double> square(result.values.size(), 0.0);
  for (int s = first; s < first + count; ++s) {  // two passes: no cancellation
    const double* values = step_values(trace, s);
    for (size_t i = 0; i < square.size(); ++i) {
      const double deviation = values[i] - mean_sum.values[i] / count;
      square[i] += deviation * deviation;
    }
  }
  for (size_t i = 0; i < square.size(); ++i)
    result.values[i] = std::max(0.0, (mean_sum.values[i] / count + z * std::sqrt(square[i] / count)) * count);
  return result;
}

// auto's choice (estimator.h): the half-life (INFINITY = the plain sum) whose
// estimate from the older half of the steps predicts the newer half's mean
// per step, a shorter memory winning only by more than kAutoMargin.
double auto_half_life(const LoadTrace& trace, int first, int count) {
  if (count < 4) return INFINITY;
  const int older = count / 2, newer = count - older;
  const LoadMatrix target = weighted_sum(trace, first + older, newer, INFINITY);
  double scale = 0;  // errors below 1e-12 of the target's own size are rounding, not prediction
  for (double v : target.values) scale += (v / newer) * (v / newer);
  auto error_of = [&](double half_life) {
    const LoadMatrix predicted = weighted_sum(trace, first, older, half_life);
    double error = 0;
    for (size_t i = 0; i < target.values.size(); ++i) {
      const double miss = predicted.values[i] / older - target.values[i] / newer;
      error += miss * miss;
    }
    return error;
  };
  double best = INFINITY, best_error = error_of(INFINITY);
  for (auto it = std::rbegin(kAutoHalfLives); it != std::rend(kAutoHalfLives); ++it) {  // longest memory first
    const double error = error_of(*it);
    if (error < (1 - kAutoMargin) * best_error - 1e-12 * scale) best = *it, best_error = error;
  }
  return best;
}

Status check_steps(const LoadTrace& trace, int first, int count) {
  if (count <= 0 || first < 0 || first > trace.num_steps - count)
    return error(Code::InvalidArgument, "estimator: steps [" + std::to_string(first) + ", " +
                                            std::to_string(int64_t(first) + count) + ") are not inside the trace's " +
                                            std::to_string(trace.num_steps) + " steps");
  const size_t cells = size_t(trace.num_layers) * trace.num_experts;
  if (trace.values.size() != size_t(trace.num_steps) * cells)
    return error(Code::InvalidArgument, "estimator: trace values do not match its shape");
  return Status::ok();
}

}  // namespace

Result<Estimator> resolve_estimator(const LoadTrace& trace, int first, int count, const Estimator& estimator) {
  EPLB_TRY(check_steps(trace, first, count));
  if (estimator.kind != EstimatorKind::Auto) return estimator;
  Estimator resolved;
  const double half_life = auto_half_life(trace, first, count);
  if (!std::isinf(half_life)) {
    resolved.kind = EstimatorKind::Ema;
    resolved.half_life = half_life;
  }
  return resolved;
}

Result<LoadMatrix> estimate_load(const LoadTrace& trace, int first, int count, const Estimator& estimator) {
  EPLB_TRY(check_steps(trace, first, count));
  switch (estimator.kind) {
    case EstimatorKind::Sum: return weighted_sum(trace, first, count, INFINITY);
    case EstimatorKind::Ema:
      if (!(estimator.half_life > 0)) return error(Code::InvalidArgument, "estimator: ema half-life must be > 0");
      return weighted_sum(trace, first, count, estimator.half_life);
    case EstimatorKind::Robust:
      if (!std::isfinite(estimator.z)) return error(Code::InvalidArgument, "estimator: robust z must be finite");
      return robust_load(trace, first, count, estimator.z);
    case EstimatorKind::Auto: return weighted_sum(trace, first, count, auto_half_life(trace, first, count));
  }
  return error(Code::InvalidArgument, "estimator: unknown kind");
}

}  // namespace eplb
