// The fluid network model (eplb/cluster.h): flows share links max-min
// fairly; each receiver runs its groups of flows one after another.
//
// Rates by progressive filling: the link with the smallest fair share
// (capacity left / flows not yet fixed) fixes its flows at that share,
// which leaves the other links of those flows less capacity and fewer
// flows; shares only grow as it goes, so a heap with stale entries skipped
// finds each next link. Time advances to the next flow that lands; flows
// landing within a relative 1e-9 of it land together.
#include <algorithm>
#include <limits>
#include <queue>

#include "eplb/cluster.h"

namespace eplb {

namespace {

struct FlowSpec {
  int source = 0;
  double bytes = 0;
};
using Groups = std::vector<std::vector<FlowSpec>>;  // one receiver's groups, in order

class FluidNetwork {
 public:
  FluidNetwork(const Topology& topology, const LinkBandwidths& links)
      : topology_(topology), ranks_(topology.num_ranks), hosts_(topology.num_nodes) {
    capacity_.assign(size_t(4 * ranks_ + 2 * hosts_), 0.0);
    for (int r = 0; r < ranks_; ++r) {
      capacity_[size_t(r)] = capacity_[size_t(ranks_ + r)] = links.nic;
      capacity_[size_t(2 * ranks_ + r)] = capacity_[size_t(3 * ranks_ + r)] = links.intra_host;
    }
    for (int h = 0; h < 2 * hosts_; ++h) capacity_[size_t(4 * ranks_ + h)] = links.host;  // 0: unlimited
  }

  // Seconds until every receiver's last group landed.
  double run(const std::vector<Groups>& receivers) {
    receivers_ = &receivers;
    next_group_.assign(receivers.size(), 0);
    pending_.assign(receivers.size(), 0);
    active_.clear();
    for (size_t r = 0; r < receivers.size(); ++r) start_next_group(int(r));
    double now = 0;
    while (!active_.empty()) {
      assign_rates();
      double step = std::numeric_limits<double>::infinity();
      for (const Active& flow : active_) step = std::min(step, flow.remaining / flow.rate);
      now += step;
      land(step);
    }
    return now;
  }

 private:
  struct Active {
    int receiver = 0;
    double remaining = 0, rate = 0;
    int links[4] = {};
    int num_links = 0;
  };

  void start_next_group(int receiver) {
    const Groups& groups = (*receivers_)[size_t(receiver)];
    while (next_group_[size_t(receiver)] < groups.size()) {
      const auto& group = groups[next_group_[size_t(receiver)]++];
      for (const FlowSpec& spec : group) {
        if (spec.bytes <= 0) continue;
        active_.push_back(flow(spec, receiver));
        ++pending_[size_t(receiver)];
      }
      if (pending_[size_t(receiver)] > 0) return;
    }
  }

  Active flow(const FlowSpec& spec, int receiver) const {
    Active a;
    a.receiver = receiver;
    a.remaining = spec.bytes;
    const int from = topology_.node_of_rank(spec.source), to = topology_.node_of_rank(receiver);
    auto add = [&](int link) {
      if (capacity_[size_t(link)] > 0) a.links[a.num_links++] = link;
    };
    if (from == to) {
      add(2 * ranks_ + spec.source);
      add(3 * ranks_ + receiver);
    } else {
      add(spec.source);
      add(ranks_ + receiver);
      add(4 * ranks_ + from);
      add(4 * ranks_ + hosts_ + to);
    }
    return a;
  }

  void assign_rates() {
    const size_t links = capacity_.size();
    left_ = capacity_;
    count_.assign(links, 0);
    for (const Active& f : active_)
      for (int k = 0; k < f.num_links; ++k) ++count_[size_t(f.links[k])];
    // Flows of every link (CSR).
    begin_.assign(links + 1, 0);
    for (size_t l = 0; l < links; ++l) begin_[l + 1] = begin_[l] + count_[l];
    members_.resize(begin_[links]);
    fill_ = begin_;
    for (size_t i = 0; i < active_.size(); ++i)
      for (int k = 0; k < active_[i].num_links; ++k) members_[fill_[size_t(active_[i].links[k])]++] = int(i);
    fixed_.assign(active_.size(), 0);
    using Entry = std::pair<double, int>;
    std::priority_queue<Entry, std::vector<Entry>, std::greater<Entry>> heap;
    for (size_t l = 0; l < links; ++l)
      if (count_[l] > 0) heap.push({left_[l] / count_[l], int(l)});
    while (!heap.empty()) {
      const auto [share, link] = heap.top();
      heap.pop();
      if (count_[size_t(link)] == 0 || share != std::max(left_[size_t(link)], 0.0) / count_[size_t(link)]) continue;
      for (size_t m = begin_[size_t(link)]; m < begin_[size_t(link) + 1]; ++m) {
        const int i = members_[m];
        if (fixed_[size_t(i)]) continue;
        fixed_[size_t(i)] = 1;
        Active& f = active_[size_t(i)];
        f.rate = share;
        for (int k = 0; k < f.num_links; ++k) {
          const size_t other = size_t(f.links[k]);
          left_[other] = std::max(left_[other] - share, 0.0);
          if (--count_[other] > 0 && int(other) != link) heap.push({left_[other] / count_[other], int(other)});
        }
      }
    }
  }

  void land(double step) {
    std::vector<int> done_receivers;
    size_t kept = 0;
    for (Active& f : active_) {
      const double moved = f.rate * step;
      if (f.remaining - moved <= 1e-9 * moved) {
        if (--pending_[size_t(f.receiver)] == 0) done_receivers.push_back(f.receiver);
        continue;
      }
      f.remaining -= moved;
      active_[kept++] = f;
    }
    active_.resize(kept);
    for (int receiver : done_receivers) start_next_group(receiver);
  }

  const Topology& topology_;
  const int ranks_, hosts_;
  std::vector<double> capacity_;  // nic out [P], nic in [P], intra out [P], intra in [P], host out [N], host in [N]
  const std::vector<Groups>* receivers_ = nullptr;
  std::vector<size_t> next_group_;
  std::vector<int> pending_;
  std::vector<Active> active_;
  std::vector<double> left_;
  std::vector<int> count_;
  std::vector<size_t> begin_, fill_;
  std::vector<int> members_;
  std::vector<char> fixed_;
};

}  // namespace

double fluid_layer_seconds(const LayerPlan& plan, const Topology& topology, const LinkBandwidths& links,
                           double bytes_per_expert, const TransferSchedule* rounds) {
  std::vector<Groups> receivers(size_t(topology.num_ranks));
  for (int r = 0; r < topology.num_ranks && size_t(r) < plan.ranks.size(); ++r) {
    if (rounds) {
      for (const auto& round : rank_rounds(*rounds, r)) {
        auto& group = receivers[size_t(r)].emplace_back();
        for (const ReadRequest& request : round) group.push_back({request.source_rank, bytes_per_expert * request.slots()});
      }
    } else {
      auto& group = receivers[size_t(r)].emplace_back();
      for (const ReadRequest& request : plan.ranks[size_t(r)].reads)
        group.push_back({request.source_rank, bytes_per_expert * request.slots()});
    }
  }
  FluidNetwork network(topology, links);
  return network.run(receivers);
}

}  // namespace eplb
