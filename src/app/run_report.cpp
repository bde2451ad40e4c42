// Rendering `eplb run`'s results: the header lines, progress lines, the
// per-round table, the closing line and the JSON report. Pure functions of
// the options, labels and summary; the CLI prints and writes them.
#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <nlohmann/json.hpp>

#include "eplb/app.h"
#include "eplb/app_metrics.h"

namespace eplb {
namespace {

double gigabytes_per_second(uint64_t bytes, double seconds) { return seconds > 0 ? double(bytes) / seconds / 1e9 : 0; }

nlohmann::json layer_json(const LayerReport& layer) {
  return {{"layer", layer.layer},
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
          {"failure", layer.failure},
          {"failure_code", layer.failure.empty() ? std::string() : metric_code_label(layer.failure_code)}};
}

nlohmann::json serving_json(const ServingStats& stats) {
  return {{"steps", stats.steps},
          {"step_seconds_p50", stats.step_seconds_p50},
          {"step_seconds_p99", stats.step_seconds_p99},
          {"stall_seconds_total", stats.stall_seconds_total},
          {"stall_seconds_max", stats.stall_seconds_max},
          {"inconsistent_reads", stats.inconsistent_reads}};
}

nlohmann::json timeline_json(const ServingTimeline& timeline) {
  nlohmann::json commits = nlohmann::json::array();
  for (const auto& commit : timeline.commits)
    commits.push_back({{"layer", commit.layer}, {"step", commit.step}, {"seconds", commit.seconds}});
  return {{"step_end_seconds", timeline.step_end_seconds},
          {"step_seconds", timeline.step_seconds},
          {"stall_seconds", timeline.stall_seconds},
          {"commits", commits}};
}

// "120 steps, p50 5.1 ms, p99 6.0 ms, stall 2.1 ms (max 0.4 ms), 0 inconsistent reads"
std::string serving_line(const ServingStats& stats) {
  return fmt::format("{} steps, step p50 {:.2f} ms, p99 {:.2f} ms, stall total {:.2f} ms (max {:.2f} ms), {} "
                     "inconsistent reads",
                     stats.steps, stats.step_seconds_p50 * 1e3, stats.step_seconds_p99 * 1e3,
                     stats.stall_seconds_total * 1e3, stats.stall_seconds_max * 1e3, stats.inconsistent_reads);
}

nlohmann::json round_json(const RoundSummary& round) {
  const RoundReport& report = round.report;
  nlohmann::json layers = nlohmann::json::array();
  for (const auto& layer : report.layers) layers.push_back(layer_json(layer));
  nlohmann::json json = {{"round", round.round + 1},
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
          {"layers", layers}};
  if (round.served) {
    json["serving"] = serving_json(round.serving);
    json["serving_timeline"] = timeline_json(round.timeline);
  }
  return json;
}

// The spare buffers of the swap commit: bytes per rank (0 with copy).
uint64_t spare_bytes(const RunOptions& options, const RunSummary& summary) {
  const bool swap = options.serving.commit == "swap";
  return swap && summary.layout.num_layers() > 0 ? rank_memory(summary.layout, true).spare_bytes : 0;
}

std::string spare_note(const RunOptions& options, const RunSummary& summary) {
  const uint64_t spare = spare_bytes(options, summary);
  return spare ? fmt::format(" with {} of spare buffers per rank", format_bytes(spare)) : "";
}

// "; arena on 4 KiB pages" (or 2 MiB, huge pages: larger than the base
// page), "" when unknown.
std::string arena_pages_note(uint64_t page_bytes) {
  if (page_bytes == 0) return "";
  const bool huge = page_bytes > uint64_t(sysconf(_SC_PAGESIZE));
  return fmt::format("; arena on {} pages{}", format_bytes(page_bytes), huge ? " (huge)" : "");
}

}  // namespace

std::string render_banner(const RunOptions& options, const RunLabels& labels, const RunSummary& summary) {
  const Topology& topology = options.topology;
  std::vector<std::string> tensors;
  for (const auto& tensor : options.tensors)
    tensors.push_back(fmt::format("{} {}", tensor.name, format_bytes(tensor.bytes_per_expert)));
  const std::string& faults = options.agent.fault_spec;
  const std::string spare = spare_note(options, summary);
  // The spare buffers: on the serving line with --async, else on the experts line.
  std::string idle, sync_spare = spare.empty() ? "" : spare + " (--commit swap)";
  if (summary.serving_idle) {
    idle = fmt::format("serving (--async, {} commits{}, step {} ms, {:.0f}% of the slots per step), idle: {}\n",
                       options.serving.commit, spare, options.serving.step_ms, options.serving.slot_share * 100,
                       serving_line(*summary.serving_idle));
    sync_spare.clear();
  }
  return fmt::format(
      "eplb run: {} ranks on {} nodes ({} bootstrap, {} transport), {}, policy {}\n"
      "experts: {} each as [{}]; {} of expert weights per rank{}\n"
      "transfers: {}; connections to peers use {}{}\n"
      "trace: {}; {} rounds of {} steps{}\n",
      topology.num_ranks, topology.num_nodes, labels.bootstrap, labels.transport, topology.to_string(),
      options.policy, format_bytes(summary.layout.bytes_per_expert(0)), fmt::join(tensors, ", "),
      format_bytes(summary.layout.total_bytes()),
      sync_spare,
      summary.transports,
      summary.peer_transports.empty() ? std::string("(no peer)") : fmt::format("{}", fmt::join(summary.peer_transports, ", ")),
      arena_pages_note(summary.arena_page_bytes),
      summary.trace_identity, options.rounds, options.window, faults.empty() ? "" : "; faults: " + faults) +
         idle;
}

std::string render_table_header() {
  return fmt::format("\n{:<5}  {:<15}  {:>10}  {:>10}  {:>10}  {:>10}  {:>8}  {:>7}  {:>7}  {:>8}  {}\n", "round",
                     "balancedness", "moved", "local", "intra-node", "inter-node", "time", "GB/s", "retries",
                     "failures", "verified");
}

std::string render_table_row(const RoundSummary& round) {
  const RoundReport& report = round.report;
  return fmt::format("{:<5}  {:<15}  {:>10}  {:>10}  {:>10}  {:>10}  {:>8}  {:>7.2f}  {:>7}  {:>8}  {}\n",
                     round.round + 1,
                     fmt::format("{:.3f} -> {:.3f}", round.balancedness_before, round.balancedness_after),
                     format_bytes(report.bytes_moved()), format_bytes(report.bytes_local()),
                     format_bytes(report.bytes_intra_node()), format_bytes(report.bytes_inter_node()),
                     format_seconds(round.seconds), gigabytes_per_second(report.bytes_moved(), round.seconds),
                     report.retries(), report.failures(), round.verified ? "yes" : "NO") +
         (round.served ? "       serving: " + serving_line(round.serving) + "\n" : "");
}

std::string render_table_end(const RunOptions& options, const RunSummary& summary) {
  const Topology& topology = options.topology;
  if (summary.all_verified)
    return fmt::format("\nall {} slots ({} layers x {} slots) on {} ranks verified byte for byte against the "
                       "mapping\n",
                       topology.num_layers * topology.num_slots, topology.num_layers, topology.num_slots,
                       topology.num_ranks);
  if (summary.rounds.empty() || !summary.group_intact) return "";
  const RoundSummary& last = summary.rounds.back();
  return fmt::format("\nround {} stopped; every rank reports the same committed mapping {:016x} ({}) and {}\n",
                     last.round + 1, summary.mapping_hash, summary.committed_layers,
                     last.verified ? "verified every slot against it" : "NOT all verified");
}

std::string render_table(const RunOptions& options, const RunSummary& summary) {
  std::string out = render_table_header();
  for (const auto& round : summary.rounds) out += render_table_row(round);
  return out + render_table_end(options, summary);
}

// The JSON report in three parts, so that rounds can be written as they end:
// the head (an object left open, ending in the "rounds" array's '['), one
// line per round, and the tail (closing both).
std::string render_json_head(const RunOptions& options, const RunLabels& labels, const RunSummary& summary) {
  nlohmann::json json;
  const Topology& t = options.topology;
  json["topology"] = {{"layers", t.num_layers}, {"experts", t.num_experts}, {"slots", t.num_slots},
                      {"groups", t.num_groups}, {"nodes", t.num_nodes},     {"ranks", t.num_ranks}};
  json["policy"] = options.policy;
  json["transport"] = labels.transport;
  json["bootstrap"] = labels.bootstrap;
  json["transports"] = summary.transports;
  json["peer_transports"] = summary.peer_transports;
  json["arena_page_bytes"] = summary.arena_page_bytes;
  json["inject"] = options.agent.fault_spec;
  json["tensors"] = nlohmann::json::array();
  for (const auto& tensor : options.tensors)
    json["tensors"].push_back({{"name", tensor.name}, {"bytes", tensor.bytes_per_expert}});
  json["trace"] = summary.trace_identity;
  json["commit"] = options.serving.commit;
  json["transfer_schedule"] = transfer_schedule_name(options.migrate);  // [issue 31]
  json["spare_bytes"] = spare_bytes(options, summary);
  if (summary.serving_idle) {
    json["serving_idle"] = serving_json(*summary.serving_idle);
    json["serving_options"] = {{"commit", options.serving.commit},
                               {"step_ms", options.serving.step_ms},
                               {"slot_share", options.serving.slot_share},
                               {"spare_bytes", spare_bytes(options, summary)}};
  }
  std::string text = json.dump(2);
  text.resize(text.size() - 2);  // "\n}"
  return text + ",\n  \"rounds\": [";
}

std::string render_json_round(const RoundSummary& round, bool first) {
  return (first ? "\n    " : ",\n    ") + round_json(round).dump();
}

std::string render_json_tail(const RunSummary& summary) {
  nlohmann::json json;
  json["all_verified"] = summary.all_verified;
  json["status"] = summary.status.is_ok() ? "ok" : summary.status.to_string();
  json["final_state"] = summary.final_state;
  if (summary.interrupted)
    json["interrupted"] = true;
  else
    json["mapping_hash"] = fmt::format("{:016x}", summary.mapping_hash);
  return "\n  ],\n" + json.dump(2).substr(2) + "\n";
}

std::string render_json(const RunOptions& options, const RunLabels& labels, const RunSummary& summary) {
  std::string out = render_json_head(options, labels, summary);
  for (size_t i = 0; i < summary.rounds.size(); ++i) out += render_json_round(summary.rounds[i], i == 0);
  return out + render_json_tail(summary);
}

std::string RunProgress::layer_done(const LayerReport& layer) {
  done_ = layer.layer + 1;
  moved_ += layer.bytes_local + layer.bytes_intra_node + layer.bytes_inter_node;
  std::string out;
  if (terminal_) {
    const int width = 24, filled = layers_ ? done_ * width / layers_ : width;
    out = fmt::format("\rround {}/{} [{}{}] layer {}/{}  {} moved", round_ + 1, rounds_, std::string(size_t(filled), '#'),
                      std::string(size_t(width - filled), '.'), done_, layers_, format_bytes(moved_));
  }
  if (!layer.failure.empty())
    out += fmt::format("{}round {} layer {}: {} after {} retr{}: {}\n", terminal_ ? "\n" : "", round_ + 1,
                       layer.layer, layer.committed ? "committed" : "FAILED", layer.retries,
                       layer.retries == 1 ? "y" : "ies", layer.failure);
  return out;
}

std::string RunProgress::round_done(const RoundSummary& round) {
  const RoundReport& report = round.report;
  const auto changed = std::count_if(report.layers.begin(), report.layers.end(), [](auto& l) { return l.changed; });
  std::string out = terminal_ ? fmt::format("\r{:80}\r", "") : std::string();
  out += fmt::format("round {}/{}: balancedness {:.3f} -> {:.3f}, {}/{} layers changed, {} moved in {} ({:.2f} GB/s), "
                     "{} retries, {}\n",
                     round.round + 1, rounds_, round.balancedness_before, round.balancedness_after, changed, layers_,
                     format_bytes(report.bytes_moved()), format_seconds(round.seconds),
                     gigabytes_per_second(report.bytes_moved(), round.seconds), report.retries(),
                     !report.status ? "ABORTED" : round.verified ? "all slots verified" : "VERIFICATION FAILED");
  round_ = round.round + 1;
  done_ = 0;
  moved_ = 0;
  return out;
}

}  // namespace eplb
