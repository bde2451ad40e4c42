// run.cpp - run_rank(): one rank of `eplb run`. Set-up (inputs, fingerprint,
// agent, store, migrator), then per round: window -> policy -> migrate ->
// verify every slot on every rank; progress, the final table and JSON.
#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "eplb/migrate.h"
#include "eplb/placement_io.h"
#include "eplb/policy.h"
#include "eplb/sim.h"

namespace eplb {
namespace {

uint64_t hash_values(const std::vector<double>& values) {
  return XXH3_64bits(values.data(), values.size() * sizeof(double));
}

uint64_t hash_mapping(const Placement& placement) {
  const auto& phy2log = placement.phy2log_data();
  return XXH3_64bits(phy2log.data(), phy2log.size() * sizeof(int32_t));
}

std::string hex(uint64_t value) {
  char text[24];
  std::snprintf(text, sizeof text, "%016llx", static_cast<unsigned long long>(value));
  return text;
}

std::string fixed(double value, int digits) {
  char text[64];
  std::snprintf(text, sizeof text, "%.*f", digits, value);
  return text;
}

double gigabytes_per_second(uint64_t bytes, double seconds) { return seconds > 0 ? double(bytes) / seconds / 1e9 : 0; }

// "layers 0-2 new, 3-7 previous"
std::string describe_layers(const std::vector<bool>& is_new) {
  std::string text;
  auto ranges = [&](bool want) {
    std::string list;
    int n = int(is_new.size());
    for (int l = 0; l < n;) {
      if (is_new[l] != want) {
        ++l;
        continue;
      }
      int end = l;
      while (end + 1 < n && is_new[end + 1] == want) ++end;
      list += (list.empty() ? "" : ",") + std::to_string(l) + (end > l ? "-" + std::to_string(end) : "");
      l = end + 1;
    }
    return list.empty() ? std::string("none") : list;
  };
  return "layers " + ranges(true) + " on the new placement, layers " + ranges(false) + " on the previous one";
}

// Ranks draw independent fault sequences: the spec's seed (default 0) plus
// the rank number.
std::string rank_fault_spec(const std::string& spec, int rank) {
  if (spec.empty()) return spec;
  std::string result;
  uint64_t seed = 0;
  size_t start = 0;
  while (start <= spec.size()) {
    size_t end = spec.find(',', start);
    if (end == std::string::npos) end = spec.size();
    std::string item = spec.substr(start, end - start);
    start = end + 1;
    if (item.rfind("seed=", 0) == 0) {
      seed = std::strtoull(item.c_str() + 5, nullptr, 10);
      continue;
    }
    result += (result.empty() ? "" : ",") + item;
  }
  return result + (result.empty() ? "" : ",") + "seed=" + std::to_string(seed + uint64_t(rank));
}

struct Inputs {
  StoreLayout layout;
  LoadTrace trace;
  std::string trace_identity;
  std::unique_ptr<Policy> policy;
};

Result<Inputs> prepare_inputs(const RunOptions& options) {
  Inputs inputs;
  const Topology& topology = options.topology;
  EPLB_TRY(topology.validate());
  if (options.rounds < 1 || options.rounds > 100000)
    return error(Code::InvalidArgument, "--rounds must be in [1, 100000], got " + std::to_string(options.rounds));
  if (options.window < 1 || options.window > 1000000)
    return error(Code::InvalidArgument, "--window must be in [1, 1000000], got " + std::to_string(options.window));
  if (options.tensors.empty()) return error(Code::InvalidArgument, "no expert tensors given");
  inputs.layout = StoreLayout::uniform(topology.num_layers, topology.slots_per_rank(), options.tensors);
  EPLB_TRY(inputs.layout.validate());
  EPLB_ASSIGN_OR_RETURN(inputs.policy, make_policy(options.policy));
  const int steps = options.rounds * options.window;
  if (!options.trace_path.empty()) {
    EPLB_ASSIGN_OR_RETURN(inputs.trace, read_load_trace(options.trace_path));
    if (inputs.trace.num_layers != topology.num_layers || inputs.trace.num_experts != topology.num_experts)
      return error(Code::InvalidArgument, "--trace " + options.trace_path + " holds " +
                                              std::to_string(inputs.trace.num_layers) + " layers x " +
                                              std::to_string(inputs.trace.num_experts) + " experts, the topology " +
                                              std::to_string(topology.num_layers) + " x " +
                                              std::to_string(topology.num_experts));
    if (inputs.trace.num_steps < steps)
      return error(Code::InvalidArgument, "--trace " + options.trace_path + " holds " +
                                              std::to_string(inputs.trace.num_steps) + " steps; " +
                                              std::to_string(options.rounds) + " rounds of --window " +
                                              std::to_string(options.window) + " need " + std::to_string(steps));
    inputs.trace_identity = "file " + options.trace_path + " xxh3 " + hex(hash_values(inputs.trace.values));
  } else {
    LoadGenOptions generate = options.generate;
    generate.num_layers = topology.num_layers;
    generate.num_experts = topology.num_experts;
    generate.num_steps = steps;
    EPLB_ASSIGN_OR_RETURN(inputs.trace, generate_load_trace(generate));
    inputs.trace_identity = std::string(generate.distribution == LoadDistribution::Zipf ? "zipf" : "lognormal") +
                            " skew " + fixed(generate.skew, 3) + " drift " + fixed(generate.drift, 4) + " seed " +
                            std::to_string(generate.seed) + " steps " + std::to_string(steps) + " xxh3 " +
                            hex(hash_values(inputs.trace.values));
  }
  return inputs;
}

void print_table(FILE* out, const RunOptions& options, const RunSummary& summary) {
  std::fprintf(out, "\n%-5s  %-15s  %10s  %10s  %10s  %10s  %8s  %7s  %7s  %8s  %s\n", "round", "balancedness",
               "moved", "local", "intra-node", "inter-node", "time", "GB/s", "retries", "failures", "verified");
  for (const auto& round : summary.rounds) {
    const RoundReport& report = round.report;
    std::string balance = fixed(round.balancedness_before, 3) + " -> " + fixed(round.balancedness_after, 3);
    std::fprintf(out, "%-5d  %-15s  %10s  %10s  %10s  %10s  %8s  %7.2f  %7d  %8d  %s\n", round.round + 1,
                 balance.c_str(), format_bytes(report.bytes_moved()).c_str(),
                 format_bytes(report.bytes_local()).c_str(), format_bytes(report.bytes_intra_node()).c_str(),
                 format_bytes(report.bytes_inter_node()).c_str(), format_seconds(round.seconds).c_str(),
                 gigabytes_per_second(report.bytes_moved(), round.seconds), report.retries(), report.failures(),
                 round.verified ? "yes" : "NO");
  }
}

nlohmann::json to_json(const RunOptions& options, const RunSummary& summary, const Inputs* inputs) {
  nlohmann::json json;
  const Topology& t = options.topology;
  json["topology"] = {{"layers", t.num_layers}, {"experts", t.num_experts}, {"slots", t.num_slots},
                      {"groups", t.num_groups}, {"nodes", t.num_nodes},     {"ranks", t.num_ranks}};
  json["policy"] = options.policy;
  json["transport"] = options.transport;
  json["bootstrap"] = options.bootstrap;
  json["inject"] = options.fault_spec;
  nlohmann::json tensors = nlohmann::json::array();
  for (const auto& tensor : options.tensors) tensors.push_back({{"name", tensor.name}, {"bytes", tensor.bytes_per_expert}});
  json["tensors"] = tensors;
  if (inputs) json["trace"] = inputs->trace_identity;
  nlohmann::json rounds = nlohmann::json::array();
  for (const auto& round : summary.rounds) {
    const RoundReport& report = round.report;
    nlohmann::json layers = nlohmann::json::array();
    for (const auto& layer : report.layers)
      layers.push_back({{"layer", layer.layer},
                        {"changed", layer.changed},
                        {"committed", layer.committed},
                        {"bytes_local", layer.bytes_local},
                        {"bytes_intra_node", layer.bytes_intra_node},
                        {"bytes_inter_node", layer.bytes_inter_node},
                        {"requests", layer.requests},
                        {"descriptors", layer.descriptors},
                        {"seconds", layer.seconds},
                        {"seconds_checksum", layer.seconds_checksum},
                        {"seconds_transfer", layer.seconds_transfer},
                        {"seconds_verify", layer.seconds_verify},
                        {"seconds_vote", layer.seconds_vote},
                        {"seconds_commit", layer.seconds_commit},
                        {"retries", layer.retries},
                        {"failure", layer.failure}});
    rounds.push_back({{"round", round.round + 1},
                      {"balancedness_before", round.balancedness_before},
                      {"balancedness_after", round.balancedness_after},
                      {"bytes_moved", report.bytes_moved()},
                      {"bytes_local", report.bytes_local()},
                      {"bytes_intra_node", report.bytes_intra_node()},
                      {"bytes_inter_node", report.bytes_inter_node()},
                      {"seconds", round.seconds},
                      {"gb_per_s", gigabytes_per_second(report.bytes_moved(), round.seconds)},
                      {"retries", report.retries()},
                      {"failures", report.failures()},
                      {"verified", round.verified},
                      {"verify_failure", round.verify_failure},
                      {"status", report.status.to_string()},
                      {"layers", layers}});
  }
  json["rounds"] = rounds;
  json["all_verified"] = summary.all_verified;
  json["status"] = summary.status.is_ok() ? "ok" : summary.status.to_string();
  json["final_state"] = summary.final_state;
  json["mapping_hash"] = hex(summary.mapping_hash);
  return json;
}

class Progress {
 public:
  Progress(FILE* out, bool tty, int rounds, int layers) : out_(out), tty_(tty), rounds_(rounds), layers_(layers) {}
  void layer_done(int round, const LayerReport& layer) {
    if (!out_) return;
    done_ = layer.layer + 1;
    moved_ += layer.bytes_local + layer.bytes_intra_node + layer.bytes_inter_node;
    if (tty_) {
      const int width = 24;
      int filled = layers_ ? done_ * width / layers_ : width;
      std::string bar(size_t(filled), '#');
      bar += std::string(size_t(width - filled), '.');
      std::fprintf(out_, "\rround %d/%d [%s] layer %d/%d  %s moved", round + 1, rounds_, bar.c_str(), done_, layers_,
                   format_bytes(moved_).c_str());
      std::fflush(out_);
    }
    if (!layer.failure.empty()) {
      if (tty_) std::fprintf(out_, "\n");
      std::fprintf(out_, "round %d layer %d: %s after %d retr%s: %s\n", round + 1, layer.layer,
                   layer.committed ? "committed" : "FAILED", layer.retries, layer.retries == 1 ? "y" : "ies",
                   layer.failure.c_str());
      std::fflush(out_);
    }
  }
  void round_done(const RoundSummary& round) {
    if (!out_) return;
    if (tty_) std::fprintf(out_, "\r%*s\r", 80, "");
    const RoundReport& report = round.report;
    std::fprintf(out_,
                 "round %d/%d: balancedness %.3f -> %.3f, %d/%d layers changed, %s moved in %s (%.2f GB/s), "
                 "%d retries, %s\n",
                 round.round + 1, rounds_, round.balancedness_before, round.balancedness_after,
                 int(std::count_if(report.layers.begin(), report.layers.end(), [](auto& l) { return l.changed; })),
                 layers_, format_bytes(report.bytes_moved()).c_str(), format_seconds(round.seconds).c_str(),
                 gigabytes_per_second(report.bytes_moved(), round.seconds), report.retries(),
                 !report.status ? "ABORTED" : round.verified ? "all slots verified" : "VERIFICATION FAILED");
    std::fflush(out_);
    done_ = 0;
    moved_ = 0;
  }

 private:
  FILE* out_;
  bool tty_;
  int rounds_;
  int layers_;
  int done_ = 0;
  uint64_t moved_ = 0;
};

}  // namespace

RunSummary run_rank(ProcessGroup& group, const RunOptions& options) {
  RunSummary summary;
  const int me = group.rank();
  FILE* out = me == 0 ? options.out : nullptr;
  const Topology& topology = options.topology;
  Deadline setup_deadline = Deadline::after_seconds(options.setup_timeout_seconds);
  auto fail = [&](Status status) {
    summary.status = std::move(status);
    return summary;
  };

  // 1. Inputs; a local failure is still announced to the others through the
  //    fingerprint so that every rank stops with the same explanation.
  auto inputs_or = prepare_inputs(options);
  std::vector<FingerprintField> fields;
  fields.push_back({"fingerprint version", "eplb run 1"});
  if (!inputs_or) {
    Status local = inputs_or.status().with_context("rank " + std::to_string(me));
    fields.push_back({"inputs", local.to_string()});
    (void)check_fingerprint(group, fields, setup_deadline);
    return fail(local);
  }
  Inputs& inputs = inputs_or.value();
  fields.push_back({"inputs", "ok"});
  fields.push_back({"topology", topology.to_string()});
  fields.push_back({"policy", options.policy});
  fields.push_back({"rounds/window", std::to_string(options.rounds) + "/" + std::to_string(options.window)});
  fields.push_back({"retries/timeout", std::to_string(options.migrate.retries) + "/" +
                                           fixed(options.migrate.timeout_seconds, 3)});
  std::string layout_text;
  for (const auto& tensor : options.tensors) layout_text += tensor.name + ":" + std::to_string(tensor.bytes_per_expert) + ",";
  fields.push_back({"expert layout", inputs.layout.to_string() + " (" + layout_text + ")"});
  fields.push_back({"trace", inputs.trace_identity});
  fields.push_back({"transport", options.transport + " via " + options.backend});
  fields.push_back({"inject", options.fault_spec});
  if (Status agreed = check_fingerprint(group, fields, setup_deadline); !agreed) return fail(agreed);

  if (out) {
    std::fprintf(out, "eplb run: %d ranks on %d nodes (%s bootstrap, %s transport), %s, policy %s\n",
                 topology.num_ranks, topology.num_nodes, options.bootstrap.c_str(), options.transport.c_str(),
                 topology.to_string().c_str(), options.policy.c_str());
    std::fprintf(out, "experts: %s each as [%s]; %s of expert weights per rank\n",
                 format_bytes(inputs.layout.bytes_per_expert(0)).c_str(),
                 [&] {
                   std::string list;
                   for (const auto& tensor : options.tensors)
                     list += (list.empty() ? "" : ", ") + tensor.name + " " + format_bytes(tensor.bytes_per_expert);
                   return list;
                 }().c_str(),
                 format_bytes(inputs.layout.total_bytes()).c_str());
    std::fprintf(out, "trace: %s; %d rounds of %d steps%s\n", inputs.trace_identity.c_str(), options.rounds,
                 options.window, options.fault_spec.empty() ? "" : ("; faults: " + options.fault_spec).c_str());
    std::fflush(out);
  }

  // 2. Agent, store, migrator.
  // Destroyed in reverse order: the migrator (deregisters), the agent (frees
  // an arena it allocated; pending backend work still finds private memory
  // mapped), then the store.
  std::unique_ptr<ExpertStore> store;
  std::unique_ptr<xfer::Agent> agent;
  xfer::AgentConfig config;
  config.name = options.agent_prefix + std::to_string(me);
  config.backend = options.backend;
  config.fault_spec = rank_fault_spec(options.fault_spec, me);
  // Every rank may read any peer's rows in some round: map them up front.
  config.map_peer_memory_eagerly = true;
  auto agent_or = xfer::Agent::create(config);
  if (!agent_or) return fail(agent_or.status().with_context("rank " + std::to_string(me) + ": creating the transfer agent"));
  agent = std::move(agent_or).value();
  auto store_or = ExpertStore::create_arena(inputs.layout, me * topology.slots_per_rank(), agent.get());
  if (!store_or) return fail(store_or.status().with_context("rank " + std::to_string(me)));
  store = std::move(store_or).value();
  Placement current = default_placement(topology);
  store->fill_simulated(current);
  auto migrator_or = Migrator::create(group, *agent, *store, topology, options.migrate, setup_deadline);
  if (!migrator_or) return fail(migrator_or.status());
  auto migrator = std::move(migrator_or).value();

  // 3. Rounds.
  Progress progress(out, options.tty, options.rounds, topology.num_layers);
  PolicyOptions policy_options;
  policy_options.threads = options.threads;
  std::vector<bool> layer_is_new(size_t(topology.num_layers), false);
  for (int round = 0; round < options.rounds; ++round) {
    RoundSummary round_summary;
    round_summary.round = round;
    LoadMatrix window = inputs.trace.sum(round * options.window, options.window);
    auto target_or = inputs.policy->place(window, topology, current, policy_options);
    if (!target_or) return fail(target_or.status().with_context("round " + std::to_string(round + 1) + ": policy " + options.policy));
    const Placement& target = target_or.value();
    round_summary.balancedness_before = balancedness(current, window, topology).mean_balancedness;
    round_summary.balancedness_after = balancedness(target, window, topology).mean_balancedness;
    std::fill(layer_is_new.begin(), layer_is_new.end(), false);
    migrator->options().on_layer_done = [&](const LayerReport& layer) {
      layer_is_new[size_t(layer.layer)] = layer.committed;
      progress.layer_done(round, layer);
    };
    round_summary.report = migrator->migrate(current, target);
    const Status& round_status = round_summary.report.status;

    // Verify every slot of every layer on this rank against the committed
    // mapping, then (when the group is intact) agree on the result.
    Status verified = store->verify_simulated(current);
    summary.mapping_hash = hash_mapping(current);
    bool group_lost = !round_status && round_status.code() != Code::Aborted;
    if (!group_lost) {
      std::string mine = fixed(round_summary.report.seconds, 6) + "|" + hex(summary.mapping_hash) + "|" +
                         (verified ? "" : verified.to_string());
      auto gathered = group.allgather(mine, Deadline::after_seconds(30));
      if (!gathered) {
        group_lost = true;
        round_summary.verify_failure = gathered.status().to_string();
        if (round_status) round_summary.report.status = gathered.status().with_context("after round " + std::to_string(round + 1));
      } else {
        round_summary.verified = true;
        for (size_t r = 0; r < gathered->size(); ++r) {
          const std::string& entry = gathered.value()[r];
          size_t bar = entry.find('|');
          size_t bar2 = bar == std::string::npos ? bar : entry.find('|', bar + 1);
          if (bar == std::string::npos || bar2 == std::string::npos) {
            round_summary.verified = false;
            round_summary.verify_failure = "rank " + std::to_string(r) + " sent a malformed verification message";
            continue;
          }
          round_summary.seconds = std::max(round_summary.seconds, std::atof(entry.substr(0, bar).c_str()));
          std::string hash = entry.substr(bar + 1, bar2 - bar - 1);
          std::string failure = entry.substr(bar2 + 1);
          if (!failure.empty() && round_summary.verified) {
            round_summary.verified = false;
            round_summary.verify_failure = "rank " + std::to_string(r) + ": " + failure;
          } else if (hash != hex(summary.mapping_hash) && round_summary.verified) {
            round_summary.verified = false;
            round_summary.verify_failure = "rank " + std::to_string(r) + " committed a different mapping (" + hash +
                                           ") than rank " + std::to_string(me) + " (" + hex(summary.mapping_hash) + ")";
          }
        }
      }
    }
    if (group_lost) {
      round_summary.seconds = round_summary.report.seconds;
      round_summary.verified = verified.is_ok();
      if (!verified) round_summary.verify_failure = verified.to_string();
    }
    progress.round_done(round_summary);
    summary.rounds.push_back(round_summary);

    if (!round_status || !round_summary.verified) {
      summary.all_verified = false;
      summary.final_state = "rank " + std::to_string(me) + ": round " + std::to_string(round + 1) + " stopped; " +
                            describe_layers(layer_is_new) + " (mapping " + hex(summary.mapping_hash) + "); " +
                            (verified ? "all " + std::to_string(topology.num_layers * topology.slots_per_rank()) +
                                            " slots verified byte for byte against that mapping"
                                      : "VERIFICATION FAILED: " + verified.to_string());
      if (!round_status)
        summary.status = round_status;
      else
        summary.status = error(Code::Mismatch, "round " + std::to_string(round + 1) + ": " + round_summary.verify_failure);
      if (out) {
        print_table(out, options, summary);
        if (!group_lost)
          std::fprintf(out, "\nround %d stopped; every rank reports the same committed mapping %s (%s) and %s\n",
                       round + 1, hex(summary.mapping_hash).c_str(), describe_layers(layer_is_new).c_str(),
                       round_summary.verified ? "verified every slot against it" : "NOT all verified");
      }
      // Every rank states its own committed state (survivors too).
      std::fprintf(stderr, "eplb: %s\n", summary.final_state.c_str());
      break;
    }
  }
  if (summary.status) {
    summary.all_verified = true;
    summary.final_state = "rank " + std::to_string(me) + ": all " + std::to_string(options.rounds) +
                          " rounds committed (mapping " + hex(summary.mapping_hash) + ")";
    if (out) {
      print_table(out, options, summary);
      std::fprintf(out, "\nall %d slots (%d layers x %d slots) on %d ranks verified byte for byte against the mapping\n",
                   topology.num_layers * topology.num_slots, topology.num_layers, topology.num_slots,
                   topology.num_ranks);
    }
  }
  if (me == 0 && !options.json_path.empty()) {
    std::ofstream file(options.json_path);
    file << to_json(options, summary, &inputs).dump(2) << "\n";
    if (!file && summary.status)
      summary.status = error(Code::IoError, "cannot write --json " + options.json_path);
  }
  if (out) std::fflush(out);
  return summary;
}

}  // namespace eplb
