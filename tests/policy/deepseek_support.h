// deepseek_support.h - helpers shared by the deepseek policy tests: random
// shapes and loads, JSON fixtures, and a deliberately naive transcription of
// the published algorithm (linear scans, stable_sort) that the heap-based
// implementation must match bit for bit.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <fstream>
#include <nlohmann/json.hpp>
#include <numeric>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "eplb/placement.h"

namespace eplb::testing_support {

inline nlohmann::json read_json(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return nlohmann::json::parse(text.str());
}

inline std::string reference_path(const std::string& name) {
  return std::string(EPLB_SOURCE_DIR) + "/tests/data/reference/" + name;
}

inline LoadMatrix load_from_json(const nlohmann::json& rows) {
  LoadMatrix load(int(rows.size()), int(rows.at(0).size()));
  for (int l = 0; l < load.num_layers; ++l)
    for (int e = 0; e < load.num_experts; ++e) load.at(l, e) = rows.at(l).at(e).get<double>();
  return load;
}

// Load patterns: many ties, wide integers, all zero, fractional, all equal.
enum class LoadKind { SmallIntegers, Integers, Zero, Fractional, Equal };

inline LoadMatrix random_load(int layers, int experts, LoadKind kind, std::mt19937_64& rng) {
  LoadMatrix load(layers, experts);
  std::uniform_int_distribution<int> small(0, 4), wide(0, 100000);
  std::uniform_real_distribution<double> real(0.0, 1000.0);
  for (double& v : load.values) {
    switch (kind) {
      case LoadKind::SmallIntegers: v = small(rng); break;
      case LoadKind::Integers: v = wide(rng); break;
      case LoadKind::Zero: v = 0; break;
      case LoadKind::Fractional: v = real(rng); break;
      case LoadKind::Equal: v = 7; break;
    }
  }
  return load;
}

// A Zipf-like DeepSeek-V3 load: expert popularity ~ 1/rank^s, shuffled per layer.
inline LoadMatrix zipf_load(int layers, int experts, uint64_t seed) {
  std::mt19937_64 rng(seed);
  LoadMatrix load(layers, experts);
  std::vector<int> order(static_cast<size_t>(experts));
  for (int l = 0; l < layers; ++l) {
    std::iota(order.begin(), order.end(), 0);
    std::shuffle(order.begin(), order.end(), rng);
    for (int i = 0; i < experts; ++i) load.at(l, order[i]) = std::floor(200000.0 / (i + 1) + double(rng() % 50));
  }
  return load;
}

// The published algorithm, transcribed as literally as possible. PackLoad
// is the type pack loads accumulate in: float as published; double shows
// what a float64-accumulating port (numpy, vLLM style) does differently.
template <class PackLoad = float>
struct NaiveDeepSeekWith {
  static void pack(const std::vector<float>& weight, int packs, std::vector<int>& pack_of, std::vector<int>& position) {
    const int n = int(weight.size()), per_pack = n / packs;
    pack_of.assign(size_t(n), -1);
    position.assign(size_t(n), -1);
    if (per_pack == 1) {
      std::iota(pack_of.begin(), pack_of.end(), 0);
      std::fill(position.begin(), position.end(), 0);
      return;
    }
    std::vector<int> order(static_cast<size_t>(n));
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return weight[a] > weight[b]; });
    std::vector<PackLoad> load(size_t(packs), PackLoad(0));
    std::vector<int> filled(size_t(packs), 0);
    for (int item : order) {
      int best = -1;
      for (int p = 0; p < packs; ++p)
        if (filled[p] < per_pack && (best < 0 || load[p] < load[best])) best = p;
      pack_of[item] = best;
      position[item] = filled[best]++;
      load[best] += PackLoad(weight[item]);
    }
  }

  static void replicate(const std::vector<float>& weight, int physical, std::vector<int>& phy2expert,
                        std::vector<int>& rank, std::vector<int>& count) {
    const int n = int(weight.size());
    phy2expert.resize(size_t(physical));
    std::iota(phy2expert.begin(), phy2expert.end(), 0);
    rank.assign(size_t(physical), 0);
    count.assign(size_t(n), 1);
    for (int p = n; p < physical; ++p) {
      int best = 0;
      for (int e = 1; e < n; ++e)
        if (weight[e] / float(count[e]) > weight[best] / float(count[best])) best = e;
      phy2expert[p] = best;
      rank[p] = count[best]++;
    }
  }

  // Returns phy2log [L][R], log2phy [L][E][width], logcnt [L][E] and width.
  static void run(const LoadMatrix& load, const Topology& t, std::vector<int32_t>& phy2log,
                  std::vector<int32_t>& log2phy, std::vector<int32_t>& logcnt, int& width) {
    const bool hier = t.hierarchical();
    const int E = t.num_experts, R = t.num_slots, P = t.num_ranks;
    const int G = hier ? t.num_groups : 1, N = hier ? t.num_nodes : 1;
    const int gs = E / G, gpn = G / N, En = E / N, Rn = R / N, spr = R / P;
    phy2log.assign(size_t(t.num_layers) * R, -1);
    logcnt.assign(size_t(t.num_layers) * E, 0);
    std::vector<int32_t> slot_rank(size_t(t.num_layers) * R, -1);
    for (int l = 0; l < t.num_layers; ++l) {
      std::vector<float> w(static_cast<size_t>(E));
      for (int e = 0; e < E; ++e) w[e] = float(load.at(l, e));
      std::vector<float> group_load(size_t(G), 0.0f);
      for (int g = 0; g < G; ++g)
        for (int j = 0; j < gs; ++j) group_load[g] += w[g * gs + j];
      std::vector<int> group_node, group_position;
      pack(group_load, N, group_node, group_position);
      std::vector<int> log2mlog(static_cast<size_t>(E)), mlog2log(static_cast<size_t>(E));
      for (int e = 0; e < E; ++e) {
        int g = e / gs;
        log2mlog[e] = (group_node[g] * gpn + group_position[g]) * gs + e % gs;
        mlog2log[log2mlog[e]] = e;
      }
      std::vector<int> mlog_count(static_cast<size_t>(E));
      for (int node = 0; node < N; ++node) {
        std::vector<float> mw(static_cast<size_t>(En));
        for (int j = 0; j < En; ++j) mw[j] = w[mlog2log[node * En + j]];
        std::vector<int> phy2mlog, rank, count;
        replicate(mw, Rn, phy2mlog, rank, count);
        for (int j = 0; j < En; ++j) mlog_count[node * En + j] = count[j];
        std::vector<float> replica_load(static_cast<size_t>(Rn));
        for (int p = 0; p < Rn; ++p) replica_load[p] = mw[phy2mlog[p]] / float(count[phy2mlog[p]]);
        std::vector<int> rank_of, position;
        pack(replica_load, Rn / spr, rank_of, position);
        for (int p = 0; p < Rn; ++p) {
          int slot = node * Rn + rank_of[p] * spr + position[p];
          phy2log[size_t(l) * R + slot] = mlog2log[node * En + phy2mlog[p]];
          slot_rank[size_t(l) * R + slot] = rank[p];
        }
      }
      for (int e = 0; e < E; ++e) logcnt[size_t(l) * E + e] = mlog_count[log2mlog[e]];
    }
    width = *std::max_element(logcnt.begin(), logcnt.end());
    log2phy.assign(size_t(t.num_layers) * E * width, -1);
    for (int l = 0; l < t.num_layers; ++l)
      for (int s = 0; s < R; ++s)
        log2phy[(size_t(l) * E + phy2log[size_t(l) * R + s]) * width + slot_rank[size_t(l) * R + s]] = s;
  }
};

using NaiveDeepSeek = NaiveDeepSeekWith<float>;

}  // namespace eplb::testing_support
