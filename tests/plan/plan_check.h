// Test helpers for the planner: random valid placements and an independent
// checker of every rule in eplb/plan.h (returns the first violation, or "").
#pragma once

#include <algorithm>
#include <cstdint>
#include <random>
#include <set>
#include <span>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "eplb/placement.h"
#include "eplb/plan.h"

namespace eplb::plan_test {

// A random valid phy2log of one layer: every expert once, R - E extra
// replicas of random experts (duplicates on one rank allowed), shuffled.
inline std::vector<int32_t> random_layer(const Topology& topology, std::mt19937_64& rng) {
  std::vector<int32_t> slots(size_t(topology.num_slots));
  for (int s = 0; s < topology.num_slots; ++s)
    slots[size_t(s)] = s < topology.num_experts
                           ? s
                           : int32_t(std::uniform_int_distribution<int>(0, topology.num_experts - 1)(rng));
  for (size_t i = slots.size(); i > 1; --i)
    std::swap(slots[i - 1], slots[std::uniform_int_distribution<size_t>(0, i - 1)(rng)]);
  return slots;
}

// A valid variation of `layer`: about `fraction` of the slots change, by
// swapping slot pairs and by moving redundant replicas to other experts.
inline std::vector<int32_t> perturb_layer(std::vector<int32_t> layer, int num_experts, double fraction,
                                          std::mt19937_64& rng) {
  const int num_slots = int(layer.size());
  std::vector<int32_t> count(size_t(num_experts), 0);
  for (int32_t e : layer) ++count[size_t(e)];
  std::uniform_int_distribution<int> pick_slot(0, num_slots - 1);
  const int changes = std::max(1, int(fraction * num_slots + 0.5));
  int changed = 0;
  for (int attempt = 0; changed < changes && attempt < 100 * changes; ++attempt) {
    const int a = pick_slot(rng);
    if (attempt % 2 == 0) {
      const int b = pick_slot(rng);
      if (layer[size_t(a)] == layer[size_t(b)]) continue;
      std::swap(layer[size_t(a)], layer[size_t(b)]);
      changed += 2;
    } else {
      const int32_t old_expert = layer[size_t(a)];
      if (count[size_t(old_expert)] < 2) continue;
      const int32_t new_expert = int32_t(std::uniform_int_distribution<int>(0, num_experts - 1)(rng));
      if (new_expert == old_expert) continue;
      --count[size_t(old_expert)];
      ++count[size_t(new_expert)];
      layer[size_t(a)] = new_expert;
      changed += 1;
    }
  }
  return layer;
}

inline Placement random_placement(const Topology& topology, std::mt19937_64& rng) {
  std::vector<int32_t> phy2log;
  phy2log.reserve(size_t(topology.num_layers) * size_t(topology.num_slots));
  for (int l = 0; l < topology.num_layers; ++l) {
    auto layer = random_layer(topology, rng);
    phy2log.insert(phy2log.end(), layer.begin(), layer.end());
  }
  return std::move(Placement::from_phy2log(topology.num_layers, topology.num_experts, topology.num_slots,
                                           std::move(phy2log)))
      .value();
}

inline Placement perturb_placement(const Placement& placement, double fraction, std::mt19937_64& rng) {
  std::vector<int32_t> phy2log;
  phy2log.reserve(placement.phy2log_data().size());
  for (int l = 0; l < placement.num_layers(); ++l) {
    auto span = placement.layer_phy2log(l);
    auto layer = perturb_layer(std::vector<int32_t>(span.begin(), span.end()), placement.num_experts(), fraction, rng);
    phy2log.insert(phy2log.end(), layer.begin(), layer.end());
  }
  return std::move(Placement::from_phy2log(placement.num_layers(), placement.num_experts(), placement.num_slots(),
                                           std::move(phy2log)))
      .value();
}

// A complete textual dump, to compare plans for equality and to print them.
inline std::string dump(const LayerPlan& plan) {
  std::ostringstream out;
  out << "layer " << plan.layer << "\n";
  for (const RankLayerPlan& rank : plan.ranks) {
    out << " rank " << rank.rank << ":";
    for (const SlotOp& op : rank.slots) {
      const char* action = op.action == SlotAction::Keep ? "K" : op.action == SlotAction::LocalCopy ? "C" : "R";
      out << " [" << op.slot << " e" << op.expert << " " << action << " " << op.source_rank << ":" << op.source_slot
          << (op.copy_after_read ? " after-read" : "") << "]";
    }
    out << "\n  reads:";
    for (const ReadRequest& request : rank.reads) {
      out << " from " << request.source_rank << " {";
      for (const ReadRun& run : request.runs) out << " " << run.source_slot << "->" << run.dest_slot << "x" << run.count;
      out << " }";
    }
    out << "\n";
  }
  out << " read from:";
  for (size_t r = 0; r < plan.slots_read_from.size(); ++r) {
    out << " " << r << "{";
    for (int s : plan.slots_read_from[r]) out << " " << s;
    out << " }";
  }
  const PlanStats& st = plan.stats;
  out << "\n stats: kept " << st.slots_kept << " local " << st.slots_local_copy << " intra " << st.slots_read_intra_node
      << " inter " << st.slots_read_inter_node << " requests " << st.requests << " descriptors " << st.descriptors
      << "\n";
  return out.str();
}

// Checks every rule of the contract; returns "" or the first violation.
inline std::string check_plan(const LayerPlan& plan, std::span<const int32_t> old_phy2log,
                              std::span<const int32_t> new_phy2log, const Topology& topology) {
  std::ostringstream why;
  const int P = topology.num_ranks, R = topology.num_slots, E = topology.num_experts;
  const int spr = topology.slots_per_rank();
  if (int(plan.ranks.size()) != P) return "ranks.size() != P";
  if (int(plan.slots_read_from.size()) != P) return "slots_read_from.size() != P";

  PlanStats expected;
  std::vector<std::set<int>> read_from(static_cast<size_t>(P));
  // served[slot] = {intra reads, inter reads} served by that old slot.
  std::vector<std::pair<int, int>> served(size_t(R), {0, 0});
  for (int r = 0; r < P; ++r) {
    const RankLayerPlan& rank = plan.ranks[size_t(r)];
    const int base = r * spr;
    const int node = topology.node_of_rank(r);
    if (rank.rank != r) return "rank index mismatch at " + std::to_string(r);
    if (int(rank.slots.size()) != spr) return "rank " + std::to_string(r) + " has wrong slot count";
    auto on_rank = [&](int s) { return s >= base && s < base + spr; };
    auto old_on_rank = [&](int e) {
      for (int s = base; s < base + spr; ++s)
        if (old_phy2log[size_t(s)] == e) return true;
      return false;
    };
    std::vector<int32_t> staging(size_t(spr), -1);
    std::set<int> experts_read;
    std::set<std::pair<int, int>> op_reads;  // (source slot, dest slot)
    // Pass 1: everything that reads the old state.
    for (int i = 0; i < spr; ++i) {
      const SlotOp& op = rank.slots[size_t(i)];
      const int s = base + i;
      why << "rank " << r << " slot " << s << ": ";
      if (op.slot != s) return why.str() + "slot field is " + std::to_string(op.slot);
      if (op.expert != new_phy2log[size_t(s)]) return why.str() + "expert field differs from the new mapping";
      const int e = op.expert;
      if (old_phy2log[size_t(s)] == e && op.action != SlotAction::Keep) return why.str() + "unchanged but not Keep";
      switch (op.action) {
        case SlotAction::Keep:
          if (old_phy2log[size_t(s)] != e) return why.str() + "Keep but the expert changes";
          if (op.copy_after_read) return why.str() + "Keep with copy_after_read";
          staging[size_t(i)] = old_phy2log[size_t(s)];
          ++expected.slots_kept;
          break;
        case SlotAction::LocalCopy:
          ++expected.slots_local_copy;
          if (op.source_rank != r) return why.str() + "LocalCopy from another rank";
          if (!on_rank(op.source_slot)) return why.str() + "LocalCopy source slot not on this rank";
          if (op.copy_after_read) {
            if (old_on_rank(e)) return why.str() + "copy after read although the expert is on the rank";
            break;  // pass 2
          }
          if (old_phy2log[size_t(op.source_slot)] != e) return why.str() + "LocalCopy source does not hold the expert";
          staging[size_t(i)] = old_phy2log[size_t(op.source_slot)];
          break;
        case SlotAction::RemoteRead: {
          if (op.copy_after_read) return why.str() + "RemoteRead with copy_after_read";
          if (old_on_rank(e)) return why.str() + "RemoteRead although the rank holds the expert (local copy preferred)";
          if (op.source_slot < 0 || op.source_slot >= R) return why.str() + "RemoteRead source slot out of range";
          if (op.source_rank != topology.rank_of_slot(op.source_slot))
            return why.str() + "source_rank does not own source_slot";
          if (op.source_rank == r) return why.str() + "RemoteRead from itself";
          if (old_phy2log[size_t(op.source_slot)] != e) return why.str() + "source slot does not hold the expert";
          if (!experts_read.insert(e).second) return why.str() + "expert " + std::to_string(e) + " read twice";
          const bool intra = topology.node_of_rank(op.source_rank) == node;
          if (!intra) {
            for (int q = 0; q < R; ++q)
              if (old_phy2log[size_t(q)] == e && topology.node_of_slot(q) == node)
                return why.str() + "cross-node read although slot " + std::to_string(q) + " on the node holds it";
            ++expected.slots_read_inter_node;
            ++served[size_t(op.source_slot)].second;
          } else {
            ++expected.slots_read_intra_node;
            ++served[size_t(op.source_slot)].first;
          }
          op_reads.insert({op.source_slot, s});
          read_from[size_t(op.source_rank)].insert(op.source_slot);
          staging[size_t(i)] = old_phy2log[size_t(op.source_slot)];
          break;
        }
      }
      why.str("");
    }
    // Pass 2: copies after read, from staging.
    for (int i = 0; i < spr; ++i) {
      const SlotOp& op = rank.slots[size_t(i)];
      if (op.action != SlotAction::LocalCopy || !op.copy_after_read) continue;
      const SlotOp& from = rank.slots[size_t(op.source_slot - base)];
      if (from.action != SlotAction::RemoteRead || from.expert != op.expert)
        return "rank " + std::to_string(r) + " slot " + std::to_string(op.slot) +
               ": copy after read from a slot that does not read the expert";
      staging[size_t(i)] = staging[size_t(op.source_slot - base)];
    }
    for (int i = 0; i < spr; ++i)
      if (staging[size_t(i)] != new_phy2log[size_t(base + i)])
        return "rank " + std::to_string(r) + " slot " + std::to_string(base + i) + ": applying the plan gives expert " +
               std::to_string(staging[size_t(i)]) + ", new mapping says " + std::to_string(new_phy2log[size_t(base + i)]);

    // Requests: ordered by unique source rank, runs ordered by dest, maximal,
    // and exactly the RemoteRead ops.
    std::set<std::pair<int, int>> request_reads;
    for (size_t k = 0; k < rank.reads.size(); ++k) {
      const ReadRequest& request = rank.reads[k];
      if (k > 0 && rank.reads[k - 1].source_rank >= request.source_rank)
        return "rank " + std::to_string(r) + ": requests not strictly ordered by source rank";
      if (request.runs.empty()) return "rank " + std::to_string(r) + ": empty request";
      ++expected.requests;
      expected.descriptors += int64_t(request.runs.size());
      int total = 0;
      for (size_t j = 0; j < request.runs.size(); ++j) {
        const ReadRun& run = request.runs[j];
        if (run.count < 1) return "rank " + std::to_string(r) + ": run with count < 1";
        total += run.count;
        if (j > 0) {
          const ReadRun& prev = request.runs[j - 1];
          if (prev.dest_slot + prev.count > run.dest_slot) return "rank " + std::to_string(r) + ": runs not ordered";
          if (prev.dest_slot + prev.count == run.dest_slot && prev.source_slot + prev.count == run.source_slot)
            return "rank " + std::to_string(r) + ": two adjacent runs were not merged";
        }
        for (int c = 0; c < run.count; ++c) {
          if (topology.rank_of_slot(run.source_slot + c) != request.source_rank)
            return "rank " + std::to_string(r) + ": run row outside its request's source rank";
          request_reads.insert({run.source_slot + c, run.dest_slot + c});
        }
      }
      if (request.slots() != total) return "ReadRequest::slots() is wrong";
    }
    if (request_reads != op_reads)
      return "rank " + std::to_string(r) + ": requests do not match the RemoteRead slot ops";
  }

  for (int q = 0; q < P; ++q) {
    std::vector<int> want(read_from[size_t(q)].begin(), read_from[size_t(q)].end());
    if (plan.slots_read_from[size_t(q)] != want) return "slots_read_from[" + std::to_string(q) + "] is wrong";
  }

  // Spreading, per expert. (a) the intra-node reads of one node's receivers
  // are spread over that node's replicas within one; (b) a replica serving a
  // cross-node read serves at most one read more than any replica.
  for (int e = 0; e < E; ++e) {
    std::vector<int> replicas;
    for (int q = 0; q < R; ++q)
      if (old_phy2log[size_t(q)] == e) replicas.push_back(q);
    if (replicas.empty()) continue;
    for (int n = 0; n < topology.num_nodes; ++n) {
      int lo = 1 << 30, hi = -1, any = 0;
      for (int q : replicas)
        if (topology.node_of_slot(q) == n) {
          lo = std::min(lo, served[size_t(q)].first);
          hi = std::max(hi, served[size_t(q)].first);
          any += served[size_t(q)].first;
        }
      if (any > 0 && hi - lo > 1)
        return "expert " + std::to_string(e) + " node " + std::to_string(n) + ": intra-node reads spread " +
               std::to_string(lo) + ".." + std::to_string(hi);
    }
    int lowest_total = 1 << 30;
    for (int q : replicas) lowest_total = std::min(lowest_total, served[size_t(q)].first + served[size_t(q)].second);
    for (int q : replicas)
      if (served[size_t(q)].second > 0 && served[size_t(q)].first + served[size_t(q)].second > lowest_total + 1)
        return "expert " + std::to_string(e) + ": replica slot " + std::to_string(q) + " serves " +
               std::to_string(served[size_t(q)].first + served[size_t(q)].second) +
               " reads incl. cross-node ones while another serves " + std::to_string(lowest_total);
  }

  const PlanStats& got = plan.stats;
  if (got.slots_kept != expected.slots_kept || got.slots_local_copy != expected.slots_local_copy ||
      got.slots_read_intra_node != expected.slots_read_intra_node ||
      got.slots_read_inter_node != expected.slots_read_inter_node || got.requests != expected.requests ||
      got.descriptors != expected.descriptors)
    return "stats do not match the plan";
  if (got.slots_kept + got.slots_local_copy + got.slots_read_intra_node + got.slots_read_inter_node != R)
    return "stats do not add up to the slots";
  return "";
}

}  // namespace eplb::plan_test
