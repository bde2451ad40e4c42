#include "eplb/evaluate.h"

#include <fmt/format.h>
#include <algorithm>
#include <cstdio>
#include <ctime>

#include "eplb/common.h"

namespace eplb {

namespace {

template <typename Field>
double mean_of(const std::vector<WindowResult>& windows, Field field) {
  if (windows.empty()) return 0;
  double total = 0;
  for (const auto& window : windows) total += double(field(window));
  return total / double(windows.size());
}

// Sum of steps [first, first + count) of the trace.
LoadMatrix window_sum(const LoadTrace& trace, int first, int count) {
  LoadMatrix sum(trace.num_layers, trace.num_experts);
  const size_t cells = sum.values.size();
  for (int s = first; s < first + count; ++s) {
    const double* values = trace.values.data() + size_t(s) * cells;
    for (size_t i = 0; i < cells; ++i) sum.values[i] += values[i];
  }
  return sum;
}

}  // namespace

double PolicyEvaluation::mean_in_sample() const {
  return mean_of(windows, [](const WindowResult& w) { return w.in_sample; });
}
double PolicyEvaluation::mean_next_window() const {
  return mean_of(windows, [](const WindowResult& w) { return w.next_window; });
}
double PolicyEvaluation::mean_slots_moved() const {
  return mean_of(windows, [](const WindowResult& w) { return w.slots_moved; });
}
int64_t PolicyEvaluation::max_slots_moved() const {
  int64_t max = 0;
  for (const auto& w : windows) max = std::max(max, w.slots_moved);
  return max;
}
double PolicyEvaluation::mean_bytes_moved() const {
  return mean_of(windows, [](const WindowResult& w) { return w.bytes_moved; });
}
double PolicyEvaluation::max_bytes_moved() const {
  double max = 0;
  for (const auto& w : windows) max = std::max(max, w.bytes_moved);
  return max;
}
namespace {
template <typename Field>
double median_of(const std::vector<WindowResult>& windows, Field field) {
  if (windows.empty()) return 0;
  std::vector<double> values;
  for (const auto& w : windows) values.push_back(field(w));
  std::sort(values.begin(), values.end());
  size_t n = values.size();
  return n % 2 ? values[n / 2] : 0.5 * (values[n / 2 - 1] + values[n / 2]);
}
}  // namespace

double PolicyEvaluation::median_seconds() const {
  return median_of(windows, [](const WindowResult& w) { return w.seconds; });
}
double PolicyEvaluation::median_cpu_seconds() const {
  return median_of(windows, [](const WindowResult& w) { return w.cpu_seconds; });
}

Result<PolicyEvaluation> evaluate_policy(const LoadTrace& trace, const Topology& topology, const std::string& policy,
                                         const EvaluateOptions& options) {
  EPLB_TRY(topology.validate());
  if (trace.num_layers != topology.num_layers || trace.num_experts != topology.num_experts)
    return error(Code::Mismatch, fmt::format("trace is [{}][{}][{}] but the topology is {}", trace.num_steps,
                                             trace.num_layers, trace.num_experts, topology.to_string()));
  if (trace.values.size() != size_t(trace.num_steps) * trace.num_layers * trace.num_experts)
    return error(Code::InvalidArgument, "trace values do not match its shape");
  if (options.window <= 0) return error(Code::InvalidArgument, "window must be > 0 steps");
  if (options.history <= 0) return error(Code::InvalidArgument, "history must be >= 1 window");
  if (trace.num_steps < 2 * options.window)
    return error(Code::InvalidArgument,
                 fmt::format("trace has {} steps: fewer than two windows of {}", trace.num_steps, options.window));
  EPLB_ASSIGN_OR_RETURN(auto planner, make_policy(policy));
  PolicyEvaluation result;
  result.policy = policy;
  Placement current = default_placement(topology);
  const int window = options.window;
  const int rebalances = trace.num_steps / window - 1;
  Stopwatch since_progress;
  for (int index = 0; index < rebalances; ++index) {
    const int boundary = (index + 1) * window;
    const int first = std::max(0, boundary - options.history * window);
    EPLB_ASSIGN_OR_RETURN(Estimator applied, resolve_estimator(trace, first, boundary - first, options.estimator));
    EPLB_ASSIGN_OR_RETURN(LoadMatrix estimate, estimate_load(trace, first, boundary - first, applied));
    LoadMatrix next = window_sum(trace, boundary, window);
    Stopwatch timer;
    const std::clock_t cpu_start = std::clock();
    auto placed = planner->place(estimate, topology, current, options.policy);
    const double cpu_seconds = double(std::clock() - cpu_start) / CLOCKS_PER_SEC;
    double seconds = timer.seconds();
    if (!placed) return placed.status().with_context(fmt::format("policy {} at step {}", policy, boundary));
    WindowResult row;
    row.boundary = boundary;
    row.estimator = applied.to_string();
    row.seconds = seconds;
    row.cpu_seconds = cpu_seconds;
    row.in_sample = balancedness(*placed, estimate, topology).mean_balancedness;
    row.next_window = balancedness(*placed, next, topology).mean_balancedness;
    row.stale_next = balancedness(current, next, topology).mean_balancedness;
    for (int changed : slots_changed(current, *placed)) row.slots_moved += changed;
    row.bytes_moved = double(row.slots_moved) * options.bytes_per_expert;
    result.windows.push_back(row);
    if (options.on_rebalance)
      EPLB_TRY(options.on_rebalance(row, current, *placed, next).with_context(fmt::format("policy {} at step {}", policy, boundary)));
    current = std::move(placed).value();
    if (options.progress && (since_progress.seconds() > 1.0 || index + 1 == rebalances)) {
      options.progress(fmt::format("{}: rebalance {}/{} (step {}), next-window balancedness {:.4f}", policy,
                                   index + 1, rebalances, boundary, row.next_window));
      since_progress.reset();
    }
  }
  return result;
}

}  // namespace eplb
