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
  }
  return "sum";
}

Result<Estimator> parse_estimator(std::string_view text) {
  Estimator estimator;
  std::string_view name = text.substr(0, text.find(':'));
  bool has_argument = name.size() < text.size();
  std::string_view argument = has_argument ? text.substr(name.size() + 1) : std::string_view();
  if (name == "sum" && !has_argument) return estimator;
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
               "unknown estimator '" + std::string(text) + "' (expected sum, ema:HALF_LIFE or robust:Z)");
}

Result<LoadMatrix> estimate_load(const LoadTrace& trace, int first, int count, const Estimator& estimator) {
  if (count <= 0 || first < 0 || first > trace.num_steps - count)
    return error(Code::InvalidArgument, "estimator: steps [" + std::to_string(first) + ", " +
                                            std::to_string(int64_t(first) + count) + ") are not inside the trace's " +
                                            std::to_string(trace.num_steps) + " steps");
  const size_t cells = size_t(trace.num_layers) * trace.num_experts;
  if (trace.values.size() != size_t(trace.num_steps) * cells)
    return error(Code::InvalidArgument, "estimator: trace values do not match its shape");
  LoadMatrix result(trace.num_layers, trace.num_experts);
  auto step = [&](int s) { return trace.values.data() + size_t(s) * cells; };
  switch (estimator.kind) {
    case EstimatorKind::Sum:
      for (int s = first; s < first + count; ++s) {
        const double* values = step(s);
        for (size_t i = 0; i < cells; ++i) result.values[i] += values[i];
      }
      break;
    case EstimatorKind::Ema: {
      if (!(estimator.half_life > 0)) return error(Code::InvalidArgument, "estimator: ema half-life must be > 0");
      double total_weight = 0;
      for (int s = first; s < first + count; ++s) {
        double weight = std::exp2(-double(first + count - 1 - s) / estimator.half_life);
        total_weight += weight;
        const double* values = step(s);
        for (size_t i = 0; i < cells; ++i) result.values[i] += weight * values[i];
      }
      double scale = count / total_weight;
      for (double& v : result.values) v *= scale;
      break;
    }
    case EstimatorKind::Robust: {
      if (!std::isfinite(estimator.z)) return error(Code::InvalidArgument, "estimator: robust z must be finite");
      std::vector<double> mean(cells, 0.0), square(cells, 0.0);
      for (int s = first; s < first + count; ++s) {
        const double* values = step(s);
        for (size_t i = 0; i < cells; ++i) mean[i] += values[i];
      }
      for (double& v : mean) v /= count;
      for (int s = first; s < first + count; ++s) {  // two passes: no cancellation
        const double* values = step(s);
        for (size_t i = 0; i < cells; ++i) square[i] += (values[i] - mean[i]) * (values[i] - mean[i]);
      }
      for (size_t i = 0; i < cells; ++i) {
        double deviation = std::sqrt(square[i] / count);
        result.values[i] = std::max(0.0, (mean[i] + estimator.z * deviation) * count);
      }
      break;
    }
  }
  return result;
}

}  // namespace eplb
