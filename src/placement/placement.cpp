#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fmt/format.h>
#include <string>

#include "eplb/placement.h"

namespace eplb {

namespace {
std::string at_layer(int layer) { return fmt::format("layer {}", layer); }
}  // namespace

Placement::Placement(int num_layers, int num_experts, int num_slots, int max_replicas)
    : num_layers_(num_layers),
      num_experts_(num_experts),
      num_slots_(num_slots),
      max_replicas_(max_replicas),
      phy2log_(size_t(num_layers) * num_slots, -1),
      log2phy_(size_t(num_layers) * num_experts * max_replicas, -1),
      logcnt_(size_t(num_layers) * num_experts, 0) {}

Result<Placement> Placement::from_phy2log(int num_layers, int num_experts, int num_slots,
                                          std::vector<int32_t> phy2log) {
  if (num_layers <= 0 || num_experts <= 0 || num_slots <= 0)
    return error(Code::InvalidArgument, "placement shape must be positive");
  if (num_experts > kMaxExpertsPerLayer || int64_t(num_layers) * num_experts > kMaxTableEntries)
    return error(Code::InvalidArgument,
                 fmt::format("placement of {} experts x {} layers: at most {} experts per layer and {} in all",
                             num_experts, num_layers, kMaxExpertsPerLayer, kMaxTableEntries));
  if (phy2log.size() != size_t(num_layers) * num_slots)
    return error(Code::InvalidArgument,
                 fmt::format("phy2log holds {} entries, expected {}", phy2log.size(), size_t(num_layers) * num_slots));
  std::vector<int32_t> logcnt(size_t(num_layers) * num_experts, 0);
  for (int l = 0; l < num_layers; ++l)
    for (int s = 0; s < num_slots; ++s) {
      int32_t e = phy2log[size_t(l) * num_slots + s];
      if (e < 0 || e >= num_experts)
        return error(Code::InvalidArgument,
                     fmt::format("{}: phy2log[{}] = {} is not an expert in [0, {})", at_layer(l), s, e, num_experts));
      ++logcnt[size_t(l) * num_experts + e];
    }
  int max_replicas = std::max(1, *std::max_element(logcnt.begin(), logcnt.end()));
  Placement placement(num_layers, num_experts, num_slots, max_replicas);
  placement.phy2log_ = std::move(phy2log);
  placement.logcnt_ = logcnt;
  std::vector<int32_t> filled(static_cast<size_t>(num_experts));
  for (int l = 0; l < num_layers; ++l) {
    std::fill(filled.begin(), filled.end(), 0);
    for (int s = 0; s < num_slots; ++s) {
      int32_t e = placement.phy2log(l, s);
      placement.log2phy_[(size_t(l) * num_experts + e) * max_replicas + filled[e]++] = s;
    }
  }
  EPLB_TRY(placement.validate());
  return placement;
}

Result<Placement> Placement::from_arrays(int num_layers, int num_experts, int num_slots, int max_replicas,
                                         std::vector<int32_t> phy2log, std::vector<int32_t> log2phy,
                                         std::vector<int32_t> logcnt) {
  if (num_layers <= 0 || num_experts <= 0 || num_slots <= 0 || max_replicas <= 0)
    return error(Code::InvalidArgument, "placement shape must be positive");
  if (phy2log.size() != size_t(num_layers) * num_slots)
    return error(Code::InvalidArgument,
                 fmt::format("phy2log holds {} entries, expected {}", phy2log.size(), size_t(num_layers) * num_slots));
  if (logcnt.size() != size_t(num_layers) * num_experts)
    return error(Code::InvalidArgument,
                 fmt::format("logcnt holds {} entries, expected {}", logcnt.size(), size_t(num_layers) * num_experts));
  if (log2phy.size() != size_t(num_layers) * num_experts * max_replicas)
    return error(Code::InvalidArgument, fmt::format("log2phy holds {} entries, expected {}", log2phy.size(),
                                                    size_t(num_layers) * num_experts * max_replicas));
  Placement placement(std::move(phy2log), std::move(log2phy), std::move(logcnt), num_layers, num_experts, num_slots,
                      max_replicas);
  EPLB_TRY(placement.validate());
  return placement;
}

Placement::Placement(std::vector<int32_t> phy2log, std::vector<int32_t> log2phy, std::vector<int32_t> logcnt,
                     int num_layers, int num_experts, int num_slots, int max_replicas)
    : num_layers_(num_layers),
      num_experts_(num_experts),
      num_slots_(num_slots),
      max_replicas_(max_replicas),
      phy2log_(std::move(phy2log)),
      log2phy_(std::move(log2phy)),
      logcnt_(std::move(logcnt)) {}

Placement Placement::from_arrays_unchecked(int num_layers, int num_experts, int num_slots, int max_replicas,
                                           std::vector<int32_t> phy2log, std::vector<int32_t> log2phy,
                                           std::vector<int32_t> logcnt) {
  Placement placement(std::move(phy2log), std::move(log2phy), std::move(logcnt), num_layers, num_experts, num_slots,
                      max_replicas);
#ifndef NDEBUG
  if (Status status = placement.validate(); !status.is_ok()) {
    std::fprintf(stderr, "eplb: Placement::from_arrays_unchecked got an invalid placement: %s\n",
                 status.to_string().c_str());
    std::abort();
  }
#endif
  return placement;
}

Status Placement::validate() const {
  if (num_layers_ <= 0 || num_experts_ <= 0 || num_slots_ <= 0 || max_replicas_ <= 0)
    return error(Code::InvalidArgument, "placement is empty");
  if (phy2log_.size() != size_t(num_layers_) * num_slots_ || logcnt_.size() != size_t(num_layers_) * num_experts_ ||
      log2phy_.size() != size_t(num_layers_) * num_experts_ * max_replicas_)
    return error(Code::Internal, "placement arrays do not match their shape");
  // Linear in the size of the arrays: row pointers, and a per-layer stamp on
  // each slot to catch a slot listed twice.
  std::vector<int32_t> seen(static_cast<size_t>(num_experts_));
  std::vector<int32_t> listed_in_layer(static_cast<size_t>(num_slots_), -1);
  for (int l = 0; l < num_layers_; ++l) {
    const int32_t* layer_phy2log = phy2log_.data() + size_t(l) * num_slots_;
    const int32_t* layer_logcnt = logcnt_.data() + size_t(l) * num_experts_;
    std::fill(seen.begin(), seen.end(), 0);
    for (int s = 0; s < num_slots_; ++s) {
      int32_t e = layer_phy2log[s];
      if (e < 0 || e >= num_experts_)
        return error(Code::InvalidArgument,
                     fmt::format("{}: slot {} holds expert {}, not in [0, {})", at_layer(l), s, e, num_experts_));
      ++seen[e];
    }
    int64_t total = 0;
    for (int e = 0; e < num_experts_; ++e) {
      int32_t count = layer_logcnt[e];
      total += count;
      if (count < 1) return error(Code::InvalidArgument, fmt::format("{}: expert {} has no replica", at_layer(l), e));
      if (count != seen[e])
        return error(Code::InvalidArgument,
                     fmt::format("{}: logcnt of expert {} is {} but phy2log holds it in {} slots", at_layer(l), e,
                                 count, seen[e]));
      if (count > max_replicas_)
        return error(Code::InvalidArgument, fmt::format("{}: expert {} has {} replicas, more than log2phy's width {}",
                                                        at_layer(l), e, count, max_replicas_));
      const int32_t* row = log2phy_.data() + (size_t(l) * num_experts_ + e) * max_replicas_;
      for (int k = 0; k < count; ++k) {
        int32_t slot = row[k];
        if (slot < 0 || slot >= num_slots_ || layer_phy2log[slot] != e)
          return error(Code::InvalidArgument, fmt::format("{}: log2phy[{}][{}] = {} is not a slot holding expert {}",
                                                          at_layer(l), e, k, slot, e));
        if (listed_in_layer[slot] == l)
          return error(Code::InvalidArgument,
                       fmt::format("{}: log2phy of expert {} lists slot {} twice", at_layer(l), e, slot));
        listed_in_layer[slot] = l;
      }
      uint32_t not_padding = 0;  // ~(-1) == 0; no early exit, so the valid case runs branch-free
      for (int k = count; k < max_replicas_; ++k) not_padding |= ~uint32_t(row[k]);
      if (not_padding != 0)
        for (int k = count; k < max_replicas_; ++k)
          if (row[k] != -1)
            return error(Code::InvalidArgument,
                         fmt::format("{}: log2phy[{}][{}] = {} should be -1 padding", at_layer(l), e, k, row[k]));
    }
    if (total != num_slots_)
      return error(Code::InvalidArgument,
                   fmt::format("{}: replica counts add up to {}, not to the {} slots", at_layer(l), total, num_slots_));
  }
  return Status::ok();
}

Status Placement::validate_against(const Topology& topology) const {
  if (num_layers_ != topology.num_layers || num_experts_ != topology.num_experts ||
      num_slots_ != topology.num_slots)
    return error(Code::Mismatch,
                 fmt::format("placement shape (layers={} experts={} slots={}) does not match topology {}", num_layers_,
                             num_experts_, num_slots_, topology.to_string()));
  return validate();
}

Status Placement::set_layer(int layer, const Placement& source, int source_layer) {
  if (layer < 0 || layer >= num_layers_ || source_layer < 0 || source_layer >= source.num_layers_)
    return error(Code::InvalidArgument, "set_layer: layer out of range");
  if (source.num_experts_ != num_experts_ || source.num_slots_ != num_slots_)
    return error(Code::Mismatch, "set_layer: placements have different shapes");
  if (source.max_replicas_ > max_replicas_) {
    // Widen log2phy for every layer to the source's width.
    std::vector<int32_t> wider(size_t(num_layers_) * num_experts_ * source.max_replicas_, -1);
    for (size_t row = 0; row < size_t(num_layers_) * num_experts_; ++row)
      std::copy_n(log2phy_.begin() + row * max_replicas_, max_replicas_, wider.begin() + row * source.max_replicas_);
    log2phy_ = std::move(wider);
    max_replicas_ = source.max_replicas_;
  }
  std::copy_n(source.phy2log_.begin() + size_t(source_layer) * num_slots_, num_slots_,
              phy2log_.begin() + size_t(layer) * num_slots_);
  std::copy_n(source.logcnt_.begin() + size_t(source_layer) * num_experts_, num_experts_,
              logcnt_.begin() + size_t(layer) * num_experts_);
  for (int e = 0; e < num_experts_; ++e)
    for (int k = 0; k < max_replicas_; ++k)
      log2phy_[(size_t(layer) * num_experts_ + e) * max_replicas_ + k] =
          k < source.max_replicas_ ? source.log2phy(source_layer, e, k) : -1;
  return Status::ok();
}

Placement default_placement(const Topology& topology) {
  std::vector<int32_t> phy2log(size_t(topology.num_layers) * topology.num_slots);
  for (int l = 0; l < topology.num_layers; ++l)
    for (int s = 0; s < topology.num_slots; ++s)
      phy2log[size_t(l) * topology.num_slots + s] =
          s < topology.num_experts ? s : (s - topology.num_experts) % topology.num_experts;
  return std::move(Placement::from_phy2log(topology.num_layers, topology.num_experts, topology.num_slots,
                                           std::move(phy2log)))
      .value();
}

std::vector<double> rank_loads(const Placement& placement, const LoadMatrix& load, const Topology& topology,
                               int layer) {
  std::vector<double> loads(size_t(topology.num_ranks), 0.0);
  int per_rank = topology.slots_per_rank();
  for (int s = 0; s < placement.num_slots(); ++s) {
    int e = placement.phy2log(layer, s);
    loads[s / per_rank] += load.at(layer, e) / placement.logcnt(layer, e);
  }
  return loads;
}

BalanceSummary balancedness(const Placement& placement, const LoadMatrix& load, const Topology& topology) {
  BalanceSummary summary;
  double sum_mean = 0, sum_max = 0, sum_ratio = 0;
  for (int l = 0; l < placement.num_layers(); ++l) {
    auto loads = rank_loads(placement, load, topology, l);
    double max = 0, total = 0;
    for (double v : loads) {
      max = std::max(max, v);
      total += v;
    }
    double mean = total / double(loads.size());
    double ratio = max > 0 ? mean / max : 1.0;
    summary.per_layer.push_back(ratio);
    summary.max_load.push_back(max);
    summary.mean_load.push_back(mean);
    sum_mean += mean;
    sum_max += max;
    sum_ratio += ratio;
  }
  if (placement.num_layers() > 0) summary.mean_balancedness = sum_ratio / placement.num_layers();
  summary.sum_balancedness = sum_max > 0 ? sum_mean / sum_max : 1.0;
  return summary;
}

std::vector<int> slots_changed(const Placement& before, const Placement& after) {
  std::vector<int> changed(size_t(std::min(before.num_layers(), after.num_layers())), 0);
  if (before.num_slots() != after.num_slots()) return changed;
  for (size_t l = 0; l < changed.size(); ++l)
    for (int s = 0; s < before.num_slots(); ++s)
      changed[l] += before.phy2log(int(l), s) != after.phy2log(int(l), s);
  return changed;
}

}  // namespace eplb
