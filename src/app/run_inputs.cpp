// The inputs of one rank of `eplb run` (layout, trace, policy) and the
// fingerprint every rank must agree on before anything moves.
#include "run_inputs.h"
#include "serving_loop.h"

#include <fmt/format.h>

#include "common/bytes.h"
#include "common/text.h"
#include "eplb/placement_io.h"

namespace eplb {
namespace {

uint64_t hash_values(const std::vector<double>& values) {
  return bytes::checksum(std::string_view(reinterpret_cast<const char*>(values.data()), values.size() * sizeof(double)));
}

Status check_options(const RunOptions& options) {
  EPLB_TRY(options.topology.validate());
  if (options.rounds < 1 || options.rounds > 100000)
    return error(Code::InvalidArgument, fmt::format("rounds must be in [1, 100000], got {}", options.rounds));
  if (options.window < 1 || options.window > 1000000)
    return error(Code::InvalidArgument, fmt::format("window must be in [1, 1000000], got {}", options.window));
  if (options.tensors.empty()) return error(Code::InvalidArgument, "no expert tensors given");
  return check_serving_options(options);
}

// The trace of rounds * window steps: from the file, or generated.
Status load_trace(const RunOptions& options, RunInputs& inputs) {
  const Topology& topology = options.topology;
  const int steps = options.rounds * options.window;
  if (options.trace_path.empty()) {
    LoadGenOptions generate = options.generate;
    generate.num_layers = topology.num_layers;
    generate.num_experts = topology.num_experts;
    generate.num_steps = steps;
    EPLB_ASSIGN_OR_RETURN(inputs.trace, generate_load_trace(generate));
    inputs.trace_identity =
        fmt::format("{} skew {:.3f} drift {:.4f} seed {} steps {} xxh3 {:016x}",
                    generate.distribution == LoadDistribution::Zipf ? "zipf" : "lognormal", generate.skew,
                    generate.drift, generate.seed, steps, hash_values(inputs.trace.values));
    return Status::ok();
  }
  EPLB_ASSIGN_OR_RETURN(inputs.trace, read_load_trace(options.trace_path, options.max_input_bytes));
  const LoadTrace& trace = inputs.trace;
  if (trace.num_layers != topology.num_layers || trace.num_experts != topology.num_experts)
    return error(Code::InvalidArgument,
                 fmt::format("trace {} holds {} layers x {} experts, the topology {} x {}", options.trace_path,
                             trace.num_layers, trace.num_experts, topology.num_layers, topology.num_experts));
  if (trace.num_steps < steps)
    return error(Code::InvalidArgument,
                 fmt::format("trace {} holds {} steps; {} rounds of a {}-step window need {}", options.trace_path,
                             trace.num_steps, options.rounds, options.window, steps));
  inputs.trace_identity = fmt::format("file {} xxh3 {:016x}", options.trace_path, hash_values(trace.values));
  return Status::ok();
}

// `with_trace` false: everything but the trace (validate_run_options reads
// a trace file itself and does not generate a trace).
Result<RunInputs> prepare_inputs(const RunOptions& options, bool with_trace = true) {
  RunInputs inputs;
  EPLB_TRY(check_options(options));
  inputs.layout = StoreLayout::uniform(options.topology.num_layers, options.topology.slots_per_rank(), options.tensors);
  EPLB_TRY(inputs.layout.validate());
  EPLB_ASSIGN_OR_RETURN(inputs.policy, make_policy(options.policy));
  if (with_trace) EPLB_TRY(load_trace(options, inputs));
  return inputs;
}

std::vector<FingerprintField> fingerprint(const RunOptions& options, const RunInputs& inputs) {
  auto schedule_label = [](const MigrateOptions& migrate) {
    const auto& links = migrate.transfer_schedule;
    return links ? fmt::format("intra {} nic {} host {} fenced {}", links->intra_host, links->nic, links->host,
                               migrate.fence_schedule_rounds)
                 : "off";
  };
  std::vector<std::string> tensors;
  for (const auto& tensor : options.tensors) tensors.push_back(fmt::format("{}:{}", tensor.name, tensor.bytes_per_expert));
  const xfer::AgentConfig& agent = options.agent;
  return {{"topology", options.topology.to_string()},
          {"policy", options.policy},
          {"rounds/window", fmt::format("{}/{}", options.rounds, options.window)},
          {"retries/timeout", fmt::format("{}/{:.3f}", options.migrate.retries, options.migrate.timeout_seconds)},
          {"expert layout", fmt::format("{} ({})", inputs.layout.to_string(), fmt::join(tensors, ","))},
          {"trace", inputs.trace_identity},
          {"transport", fmt::format("{} backend, transports '{}', devices '{}'", agent.backend, agent.transports,
                                    agent.net_devices)},
          {"inject", agent.fault_spec},
          {"transfer schedule", schedule_label(options.migrate)},
          {"serving", fmt::format("async {} commit {} step_ms {:.3f} share {:.4f} idle {}", options.serving.async,
                                  options.serving.commit, options.serving.step_ms, options.serving.slot_share,
                                  options.serving.idle_steps)}};
}

}  // namespace

Result<std::string> rank_fault_spec(const std::string& spec, int rank) {
  if (spec.empty()) return spec;
  std::vector<std::string> items;
  uint64_t seed = 0;
  for (std::string_view item : text::split(spec, ',')) {
    if (!item.starts_with("seed=")) {
      items.emplace_back(item);
      continue;
    }
    EPLB_ASSIGN_OR_RETURN(seed, text::parse_uint(item.substr(5), "fault spec seed"));
  }
  items.push_back(fmt::format("seed={}", seed + uint64_t(rank)));
  return fmt::format("{}", fmt::join(items, ","));
}

Status validate_run_options(const RunOptions& options) {
  EPLB_TRY(prepare_inputs(options, !options.trace_path.empty()).status());
  xfer::AgentConfig probe;  // an in-process agent parses the fault spec exactly as every rank will
  probe.name = "validate";
  probe.backend = "loopback";
  EPLB_ASSIGN_OR_RETURN(probe.fault_spec, rank_fault_spec(options.agent.fault_spec, 0));
  auto agent = xfer::Agent::create(probe);
  return agent ? Status::ok() : agent.status();
}

Result<RunInputs> prepare_and_agree(ProcessGroup& group, const RunOptions& options, Deadline deadline) {
  auto inputs = options.precondition ? prepare_inputs(options) : Result<RunInputs>(options.precondition);
  std::vector<FingerprintField> fields{{"fingerprint version", "eplb run 2"}};
  if (!inputs) {
    Status local = inputs.status().with_context(fmt::format("rank {}", group.rank()));
    fields.push_back({"inputs", local.to_string()});
    (void)check_fingerprint(group, fields, deadline);
    return local;
  }
  fields.push_back({"inputs", "ok"});
  for (auto& field : fingerprint(options, *inputs)) fields.push_back(std::move(field));
  EPLB_TRY(check_fingerprint(group, fields, deadline));
  return inputs;
}

}  // namespace eplb
