// run_rank.cpp - run_rank(): one rank of `eplb run`. Set-up (inputs,
// fingerprint, agent, store, migrator), then per round: window -> policy ->
// migrate -> verify every slot on every rank and agree on the result.
// Results leave as a RunSummary and through the callbacks; nothing printed.
#include <fmt/format.h>

#include <algorithm>

#include "common/bytes.h"
#include "common/text.h"
#include "eplb/app.h"
#include "eplb/placement_io.h"
#include "eplb/policy.h"
#include "run_inputs.h"
#include "serving_loop.h"

namespace eplb {
namespace {

// "layers 0-2 on the new placement, layers 3-7 on the previous one"
std::string describe_layers(const std::vector<bool>& is_new) {
  auto ranges = [&](bool want) {
    std::vector<std::string> list;
    const int n = int(is_new.size());
    for (int l = 0; l < n; ++l) {
      if (is_new[l] != want) continue;
      int end = l;
      while (end + 1 < n && is_new[end + 1] == want) ++end;
      list.push_back(end > l ? fmt::format("{}-{}", l, end) : fmt::format("{}", l));
      l = end;
    }
    return list.empty() ? std::string("none") : fmt::format("{}", fmt::join(list, ","));
  };
  return fmt::format("layers {} on the new placement, layers {} on the previous one", ranges(true), ranges(false));
}

// The transfer agent, the store and the migrator of this rank. Destroyed in
// reverse order: the migrator (deregisters), the agent (frees an arena it
// allocated; pending backend work still finds private memory mapped), then
// the store.
struct RankSetup {
  std::unique_ptr<ExpertStore> store;
  std::unique_ptr<xfer::Agent> agent;
  std::unique_ptr<Migrator> migrator;
  std::unique_ptr<ServingReader> reader;  // --async only
};

Result<RankSetup> set_up_rank(ProcessGroup& group, const RunOptions& options, const StoreLayout& layout,
                              const Placement& current, Deadline deadline) {
  const int me = group.rank();
  RankSetup setup;
  xfer::AgentConfig config = options.agent;
  config.name = fmt::format("{}{}", options.agent_name_prefix, me);
  EPLB_ASSIGN_OR_RETURN(config.fault_spec, rank_fault_spec(options.agent.fault_spec, me));
  // Every rank may read any peer's rows in some round: map them up front.
  config.map_peer_memory_eagerly = true;
  auto agent = xfer::Agent::create(config);
  if (!agent) return agent.status().with_context(fmt::format("rank {}: creating the transfer agent", me));
  setup.agent = std::move(agent).value();
  MigrateOptions migrate = options.migrate;
  if (options.serving.commit == "swap") migrate.commit = CommitMode::Swap;
  auto store = ExpertStore::create_arena(layout, me * options.topology.slots_per_rank(), setup.agent.get(),
                                         migrate.commit == CommitMode::Swap);
  if (!store) return store.status().with_context(fmt::format("rank {}", me));
  setup.store = std::move(store).value();
  fill_simulated(*setup.store, current);
  EPLB_ASSIGN_OR_RETURN(setup.migrator,
                        Migrator::create(group, *setup.agent, *setup.store, options.topology, migrate, deadline));
  return setup;
}

// The transports this rank's connections use (union over peers).
std::vector<std::string> peer_transports(const xfer::Agent& agent, int me, int ranks, const std::string& prefix) {
  std::vector<std::string> all;
  for (int r = 0; r < ranks; ++r) {
    if (r == me) continue;
    auto used = agent.peer_transports(fmt::format("{}{}", prefix, r));
    if (used) all.insert(all.end(), used->begin(), used->end());
  }
  std::sort(all.begin(), all.end());
  all.erase(std::unique(all.begin(), all.end()), all.end());
  return all;
}

// After a round: this rank verifies every slot, then (when the group is
// intact) the ranks agree on the outcome.
// Returns this rank's own check.
Status verify_round(ProcessGroup& group, const ExpertStore& store, const Placement& current, RoundSummary& round,
                    RunSummary& summary, bool* group_lost) {
  const Status& round_status = round.report.status;
  Status verified = verify_simulated(store, current);
  summary.mapping_hash = mapping_hash(current);
  *group_lost = !round_status && round_status.code() != Code::Aborted;
  if (!*group_lost) {
    RankOutcome mine{round.report.seconds, summary.mapping_hash, verified ? "" : verified.to_string()};
    auto agreement = agree_on_round(group, mine, Deadline::after_seconds(30));
    if (agreement) {
      round.seconds = agreement->slowest_seconds;
      round.verified = agreement->agreed;
      round.verify_failure = agreement->failure;
      return verified;
    }
    *group_lost = true;
    round.verify_failure = agreement.status().to_string();
    if (round_status) round.report.status = agreement.status().with_context(fmt::format("after round {}", round.round + 1));
  }
  round.seconds = round.report.seconds;
  round.verified = verified.is_ok();
  if (!verified) round.verify_failure = verified.to_string();
  return verified;
}

// Why the run stopped after `round`, in the summary (status, final state).
void record_stop(const RoundSummary& round, const std::vector<bool>& layer_is_new, const Topology& topology,
                 int me, const Status& verified_here, bool group_lost, RunSummary& summary) {
  summary.all_verified = false;
  summary.group_intact = !group_lost;
  summary.committed_layers = describe_layers(layer_is_new);
  summary.final_state =
      fmt::format("rank {}: round {} stopped; {} (mapping {:016x}); {}", me, round.round + 1, summary.committed_layers,
                  summary.mapping_hash,
                  verified_here ? fmt::format("all {} slots verified byte for byte against that mapping",
                                              topology.num_layers * topology.slots_per_rank())
                                : "VERIFICATION FAILED: " + verified_here.to_string());
  summary.status = !round.report.status
                       ? round.report.status
                       : error(Code::Mismatch, fmt::format("round {}: {}", round.round + 1, round.verify_failure));
}

// One round: window -> policy -> migrate -> verify. False when the run stops.
Result<bool> run_round(ProcessGroup& group, const RunOptions& options, RunInputs& inputs, RankSetup& setup,
                       Placement& current, int round_number, RunSummary& summary) {
  const Topology& topology = options.topology;
  RoundSummary round;
  round.round = round_number;
  LoadMatrix window = inputs.trace.sum(round_number * options.window, options.window);
  PolicyOptions policy_options;
  policy_options.threads = options.threads;
  auto target = inputs.policy->place(window, topology, current, policy_options);
  if (!target) return target.status().with_context(fmt::format("round {}: policy {}", round_number + 1, options.policy));
  round.balancedness_before = balancedness(current, window, topology).mean_balancedness;
  round.balancedness_after = balancedness(*target, window, topology).mean_balancedness;
  std::vector<bool> layer_is_new(size_t(topology.num_layers), false);
  setup.migrator->options().on_layer_done = [&](const LayerReport& layer) {
    layer_is_new[size_t(layer.layer)] = layer.committed;
    if (options.migrate.on_layer_done) options.migrate.on_layer_done(layer);
  };
  if (options.serving.async) {
    ServedRound served = serve_async_round(*setup.migrator, *options.serving_group, *setup.reader, current, *target,
                                           options);
    round.report = std::move(served.report);  // its status includes the serving loop's failure
    round.served = true;
    round.serving = served.stats;
    round.timeline = std::move(served.timeline);
  } else {
    round.report = setup.migrator->migrate(current, *target);
  }
  bool group_lost = false;
  Status verified_here = verify_round(group, *setup.store, current, round, summary, &group_lost);
  if (round.serving.inconsistent_reads > 0 && verified_here) {
    verified_here = error(Code::Mismatch, fmt::format("{} inconsistent read(s) while serving; the first: {}",
                                                      round.serving.inconsistent_reads,
                                                      round.serving.first_inconsistency));
    round.verified = false;
    round.verify_failure = verified_here.to_string();
  }
  if (!options.keep_all_rounds) summary.rounds.clear();
  summary.rounds.push_back(round);
  if (options.on_round_done) options.on_round_done(round);
  if (round.report.status && round.verified) return true;
  record_stop(round, layer_is_new, topology, group.rank(), verified_here, group_lost, summary);
  return false;
}

// --async: the serving group is checked and the idle steps measured.
Status start_serving(ProcessGroup& group, const RunOptions& options, const Placement& current, RankSetup& setup,
                     RunSummary& summary) {
  if (!options.serving.async) return Status::ok();
  ProcessGroup* serving = options.serving_group;
  if (!serving || serving == &group || serving->rank() != group.rank() || serving->size() != group.size())
    return error(Code::InvalidArgument, "--async needs a serving group of its own with the same ranks");
  setup.reader = std::make_unique<ServingReader>(*setup.store, options.serving);
  auto idle = serve_idle(*serving, *setup.reader, current, options);
  if (!idle) return idle.status().with_context(fmt::format("rank {}", group.rank()));
  summary.serving_idle = *idle;
  return Status::ok();
}

}  // namespace

RunSummary run_rank(ProcessGroup& group, const RunOptions& options) {
  RunSummary summary;
  const int me = group.rank();
  const Deadline setup_deadline = Deadline::after_seconds(options.setup_timeout_seconds);
  auto inputs = prepare_and_agree(group, options, setup_deadline);
  if (!inputs) {
    summary.status = inputs.status();
    return summary;
  }
  summary.trace_identity = inputs->trace_identity;
  summary.layout = inputs->layout;
  Placement current = default_placement(options.topology);
  auto setup = set_up_rank(group, options, inputs->layout, current, setup_deadline);
  if (!setup) {
    summary.status = setup.status();
    return summary;
  }
  if (Status serving = start_serving(group, options, current, *setup, summary); !serving) {
    summary.status = serving;
    return summary;
  }
  summary.transports = setup->agent->transports();
  summary.peer_transports = peer_transports(*setup->agent, me, group.size(), options.agent_name_prefix);
  summary.arena_page_bytes = setup->store->arena_page_bytes();
  if (options.on_ready) options.on_ready(summary);
  for (int round = 0; round < options.rounds; ++round) {
    auto go_on = run_round(group, options, *inputs, *setup, current, round, summary);
    if (!go_on) summary.status = go_on.status();
    if (!go_on || !*go_on) return summary;
  }
  summary.all_verified = true;
  summary.final_state =
      fmt::format("rank {}: all {} rounds committed (mapping {:016x})", me, options.rounds, summary.mapping_hash);
  return summary;
}

}  // namespace eplb
