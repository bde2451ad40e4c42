// The contention-aware transfer schedule (eplb/plan.h, docs/scale.md).
//
// 1. Every RemoteRead of the layer plan is one expert moving from a source
//    rank to a receiver: an edge between two links.
// 2. Reads between hosts: each host's ranks are spread over host_slots
//    ports each way (one per rank when host links do not bind, one per host
//    when a host link carries one expert at a time), ranks with the most
//    experts first onto the least loaded port; then an edge colouring of
//    the (source port, receiver port) multigraph. A colouring uses as many
//    rounds as the busiest port has experts: the lower bound when the
//    experts have one size and ports are one rank or one host.
// 3. Reads inside hosts: an edge colouring of their own links.
// 4. Round i holds colour i of both.
#include <algorithm>
#include <cmath>
#include <numeric>
#include <string>
#include <tuple>

#include "edge_coloring.h"
#include "eplb/plan.h"

namespace eplb {

namespace {

using plan_detail::BipartiteEdge;

bool positive_finite(double value) { return std::isfinite(value) && value > 0; }

// One expert read (the unit of the schedule).
struct Chunk {
  int receiver, source, source_slot, dest_slot;
  bool inter_host;
};

std::vector<Chunk> chunks_of(const LayerPlan& plan, const Topology& topology) {
  std::vector<Chunk> chunks;
  for (const RankLayerPlan& rank : plan.ranks)
    for (const ReadRequest& request : rank.reads)
      for (const ReadRun& run : request.runs)
        for (int i = 0; i < run.count; ++i)
          chunks.push_back({rank.rank, request.source_rank, run.source_slot + i, run.dest_slot + i,
                            topology.node_of_rank(rank.rank) != topology.node_of_rank(request.source_rank)});
  return chunks;
}

// Experts a host link carries at once: as many as its bandwidth holds NICs
// at full speed (>= 1); ranks per host when it does not bind.
int host_slots_of(const LinkBandwidths& bandwidths, int ranks_per_host) {
  if (bandwidths.host <= 0 || bandwidths.host >= double(ranks_per_host) * bandwidths.nic) return ranks_per_host;
  return std::max(1, int(std::floor(bandwidths.host / bandwidths.nic + 1e-9)));
}

// Colours of the chunks selected by `pick`, on a multigraph whose ends are
// given by `left` and `right`; -1 for chunks not picked.
template <class Pick, class Left, class Right>
std::vector<int32_t> color_chunks(const std::vector<Chunk>& chunks, Pick pick, Left left, Right right, int vertices,
                                  int& colors) {
  std::vector<BipartiteEdge> edges;
  std::vector<size_t> index;
  for (size_t i = 0; i < chunks.size(); ++i)
    if (pick(chunks[i])) {
      edges.push_back({left(chunks[i]), right(chunks[i])});
      index.push_back(i);
    }
  std::vector<int32_t> edge_color = plan_detail::color_bipartite_edges(edges, vertices, vertices, colors);
  std::vector<int32_t> color(chunks.size(), -1);
  for (size_t k = 0; k < index.size(); ++k) color[index[k]] = edge_color[k];
  return color;
}

// Each host's NIC egress (or ingress) ends spread over `host_slots` ports:
// ranks by descending number of experts, each onto the least loaded port of
// its host (longest processing time first). A port then carries one expert
// per round, so a host carries at most host_slots and a rank at most one.
std::vector<int32_t> ports_of(const std::vector<Chunk>& chunks, const Topology& topology, int host_slots,
                              bool outgoing) {
  const int ranks = topology.num_ranks, per_host = topology.ranks_per_node();
  std::vector<int64_t> degree(size_t(ranks), 0);
  for (const Chunk& c : chunks)
    if (c.inter_host) ++degree[size_t(outgoing ? c.source : c.receiver)];
  std::vector<int32_t> port(size_t(ranks), 0);
  std::vector<int> order(static_cast<size_t>(per_host));
  std::vector<int64_t> port_load(static_cast<size_t>(host_slots));
  for (int host = 0; host < topology.num_nodes; ++host) {
    std::iota(order.begin(), order.end(), host * per_host);
    std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return degree[size_t(a)] > degree[size_t(b)]; });
    std::fill(port_load.begin(), port_load.end(), 0);
    std::vector<int> ranks_on(size_t(host_slots), 0);
    for (int rank : order) {
      int best = 0;
      for (int p = 1; p < host_slots; ++p)
        if (std::tie(port_load[size_t(p)], ranks_on[size_t(p)]) < std::tie(port_load[size_t(best)], ranks_on[size_t(best)]))
          best = p;
      port_load[size_t(best)] += degree[size_t(rank)];
      ++ranks_on[size_t(best)];
      port[size_t(rank)] = int32_t(host * host_slots + best);
    }
  }
  return port;
}

// The busiest link of a round: bytes over bandwidth.
double round_seconds(const TransferRound& round, const Topology& topology, const LinkBandwidths& bandwidths,
                     double bytes_per_expert) {
  LinkLoads loads(topology.num_ranks, topology.num_nodes);
  std::vector<int> touched_ranks, touched_hosts;
  for (const ScheduledRead& read : round.reads) {
    const double bytes = bytes_per_expert * read.run.count;
    if (read.inter_host) {
      loads.nic_out[size_t(read.source)] += bytes;
      loads.nic_in[size_t(read.receiver)] += bytes;
      loads.host_out[size_t(topology.node_of_rank(read.source))] += bytes;
      loads.host_in[size_t(topology.node_of_rank(read.receiver))] += bytes;
    } else {
      loads.intra_out[size_t(read.source)] += bytes;
      loads.intra_in[size_t(read.receiver)] += bytes;
    }
  }
  return lower_bound_seconds(loads, bandwidths);
}

}  // namespace

Status LinkBandwidths::validate() const {
  if (!positive_finite(intra_host) || !positive_finite(nic) || !(std::isfinite(host) && host >= 0))
    return error(Code::InvalidArgument,
                 "link bandwidths must be finite and > 0 bytes/s (host: >= 0, 0 for unlimited); got intra-host " +
                     std::to_string(intra_host) + ", NIC " + std::to_string(nic) + ", host " + std::to_string(host));
  return Status::ok();
}

LinkLoads::LinkLoads(int ranks, int hosts)
    : intra_out(size_t(ranks), 0.0),
      intra_in(size_t(ranks), 0.0),
      nic_out(size_t(ranks), 0.0),
      nic_in(size_t(ranks), 0.0),
      host_out(size_t(hosts), 0.0),
      host_in(size_t(hosts), 0.0) {}

LinkLoads& LinkLoads::operator+=(const LinkLoads& other) {
  auto add = [](std::vector<double>& to, const std::vector<double>& from) {
    if (to.size() < from.size()) to.resize(from.size(), 0.0);
    for (size_t i = 0; i < from.size(); ++i) to[i] += from[i];
  };
  add(intra_out, other.intra_out);
  add(intra_in, other.intra_in);
  add(nic_out, other.nic_out);
  add(nic_in, other.nic_in);
  add(host_out, other.host_out);
  add(host_in, other.host_in);
  return *this;
}

double LinkLoads::total_inter_host() const { return std::accumulate(nic_in.begin(), nic_in.end(), 0.0); }
double LinkLoads::total_intra_host() const { return std::accumulate(intra_in.begin(), intra_in.end(), 0.0); }

LinkLoads link_loads(const LayerPlan& plan, const Topology& topology, double bytes_per_expert) {
  LinkLoads loads(topology.num_ranks, topology.num_nodes);
  for (const RankLayerPlan& rank : plan.ranks)
    for (const ReadRequest& request : rank.reads) {
      const double bytes = bytes_per_expert * request.slots();
      const int from = topology.node_of_rank(request.source_rank), to = topology.node_of_rank(rank.rank);
      if (from == to) {
        loads.intra_out[size_t(request.source_rank)] += bytes;
        loads.intra_in[size_t(rank.rank)] += bytes;
      } else {
        loads.nic_out[size_t(request.source_rank)] += bytes;
        loads.nic_in[size_t(rank.rank)] += bytes;
        loads.host_out[size_t(from)] += bytes;
        loads.host_in[size_t(to)] += bytes;
      }
    }
  return loads;
}

double lower_bound_seconds(const LinkLoads& loads, const LinkBandwidths& bandwidths) {
  auto busiest = [](const std::vector<double>& values) {
    return values.empty() ? 0.0 : *std::max_element(values.begin(), values.end());
  };
  double seconds = std::max(busiest(loads.intra_out), busiest(loads.intra_in)) / bandwidths.intra_host;
  seconds = std::max(seconds, std::max(busiest(loads.nic_out), busiest(loads.nic_in)) / bandwidths.nic);
  if (bandwidths.host > 0)
    seconds = std::max(seconds, std::max(busiest(loads.host_out), busiest(loads.host_in)) / bandwidths.host);
  return seconds;
}

Result<TransferSchedule> schedule_transfers(const LayerPlan& plan, const Topology& topology,
                                            const LinkBandwidths& bandwidths, double bytes_per_expert) {
  EPLB_TRY(topology.validate().with_context("schedule transfers"));
  EPLB_TRY(bandwidths.validate().with_context("schedule transfers"));
  if (!positive_finite(bytes_per_expert))
    return error(Code::InvalidArgument, "schedule transfers: bytes per expert must be finite and > 0");
  if (plan.ranks.size() != size_t(topology.num_ranks))
    return error(Code::InvalidArgument, "schedule transfers: the plan has " + std::to_string(plan.ranks.size()) +
                                            " ranks, topology " + topology.to_string() + " has " +
                                            std::to_string(topology.num_ranks));
  TransferSchedule schedule;
  schedule.layer = plan.layer;
  schedule.loads = link_loads(plan, topology, bytes_per_expert);
  schedule.lower_bound_seconds = lower_bound_seconds(schedule.loads, bandwidths);
  const int ranks_per_host = topology.ranks_per_node();
  schedule.host_slots = host_slots_of(bandwidths, ranks_per_host);
  const std::vector<Chunk> chunks = chunks_of(plan, topology);

  auto is_inter = [](const Chunk& c) { return c.inter_host; };
  auto is_intra = [](const Chunk& c) { return !c.inter_host; };
  auto source_rank = [](const Chunk& c) { return int32_t(c.source); };
  auto receiver_rank = [](const Chunk& c) { return int32_t(c.receiver); };
  const std::vector<int32_t> out_port = ports_of(chunks, topology, schedule.host_slots, true);
  const std::vector<int32_t> in_port = ports_of(chunks, topology, schedule.host_slots, false);
  auto source_port = [&](const Chunk& c) { return out_port[size_t(c.source)]; };
  auto receiver_port = [&](const Chunk& c) { return in_port[size_t(c.receiver)]; };
  int inter_rounds = 0, intra_rounds = 0;
  std::vector<int32_t> inter = color_chunks(chunks, is_inter, source_port, receiver_port,
                                            topology.num_nodes * schedule.host_slots, inter_rounds);
  std::vector<int32_t> intra =
      color_chunks(chunks, is_intra, source_rank, receiver_rank, topology.num_ranks, intra_rounds);

  schedule.rounds.resize(size_t(std::max(inter_rounds, intra_rounds)));
  for (size_t i = 0; i < chunks.size(); ++i) {
    const Chunk& c = chunks[i];
    const int32_t round = c.inter_host ? inter[i] : intra[i];
    schedule.rounds[size_t(round)].reads.push_back({c.receiver, c.source, {c.source_slot, c.dest_slot, 1}, c.inter_host});
  }
  for (TransferRound& round : schedule.rounds) {
    round.seconds = round_seconds(round, topology, bandwidths, bytes_per_expert);
    schedule.makespan_seconds += round.seconds;
  }
  return schedule;
}

std::vector<std::vector<ReadRequest>> rank_rounds(const TransferSchedule& schedule, int rank,
                                                  bool keep_empty_rounds) {
  std::vector<std::vector<ReadRequest>> rounds;
  for (const TransferRound& round : schedule.rounds) {
    std::vector<ReadRequest> requests;
    for (const ScheduledRead& read : round.reads) {  // ordered by receiver, source, dest slot
      if (read.receiver != rank) continue;
      if (requests.empty() || requests.back().source_rank != read.source)
        requests.push_back(ReadRequest{read.source, {}});
      ReadRunList& runs = requests.back().runs;
      if (!runs.empty() && runs.back().source_slot + runs.back().count == read.run.source_slot &&
          runs.back().dest_slot + runs.back().count == read.run.dest_slot)
        runs.back().count += read.run.count;
      else
        runs.push_back(read.run);
    }
    if (!requests.empty() || keep_empty_rounds) rounds.push_back(std::move(requests));
  }
  return rounds;
}

}  // namespace eplb
