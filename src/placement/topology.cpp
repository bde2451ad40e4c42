#include <cmath>
#include <fmt/format.h>
#include <sstream>

#include "eplb/placement.h"

namespace eplb {

Status Topology::validate() const {
  auto bad = [this](const std::string& why) {
    return error(Code::InvalidArgument, "invalid topology (" + to_string() + "): " + why);
  };
  if (num_layers <= 0) return bad("layers must be > 0");
  if (num_experts <= 0) return bad("experts must be > 0");
  if (num_slots <= 0) return bad("slots (replicas) must be > 0");
  if (num_groups <= 0) return bad("groups must be > 0");
  if (num_nodes <= 0) return bad("nodes must be > 0");
  if (num_ranks <= 0) return bad("ranks must be > 0");
  if (num_slots < num_experts) return bad(fmt::format("slots R={} must be >= experts E={}", num_slots, num_experts));
  if (num_slots % num_ranks != 0)
    return bad(fmt::format("slots R={} must be a multiple of ranks P={}", num_slots, num_ranks));
  if (num_ranks % num_nodes != 0)
    return bad(fmt::format("ranks P={} must be a multiple of nodes N={}", num_ranks, num_nodes));
  if (num_experts % num_groups != 0)
    return bad(fmt::format("experts E={} must be a multiple of groups G={}", num_experts, num_groups));
  if (num_slots > kMaxSlotsPerLayer) return bad(fmt::format("slots R={} above the cap, at most {}", num_slots, kMaxSlotsPerLayer));
  if (num_experts > kMaxExpertsPerLayer)
    return bad(fmt::format("experts E={} above the cap, at most {}", num_experts, kMaxExpertsPerLayer));
  if (int64_t(num_layers) * num_slots > kMaxTableEntries)
    return bad(fmt::format("layers x slots = {} above the cap, at most {}", int64_t(num_layers) * num_slots,
                           kMaxTableEntries));
  return Status::ok();
}

std::string Topology::to_string() const {
  std::ostringstream text;
  text << "L=" << num_layers << " E=" << num_experts << " R=" << num_slots << " G=" << num_groups
       << " N=" << num_nodes << " P=" << num_ranks;
  return text.str();
}

Result<Topology> topology_preset(const std::string& name) {
  //                                    L    E    R    G  N   P
  if (name == "deepseek-v3") return Topology{58, 256, 288, 8, 4, 32};
  if (name == "qwen3-235b") return Topology{94, 128, 144, 1, 2, 16};
  if (name == "mixtral-8x7b") return Topology{32, 8, 16, 1, 1, 8};
  if (name == "tiny") return Topology{2, 12, 16, 4, 2, 8};
  return error(Code::InvalidArgument,
               "unknown preset '" + name + "' (known: deepseek-v3, qwen3-235b, mixtral-8x7b, tiny)");
}

Status LoadMatrix::validate() const {
  if (num_layers <= 0 || num_experts <= 0)
    return error(Code::InvalidArgument, fmt::format("load matrix is empty ({} x {})", num_layers, num_experts));
  if (values.size() != size_t(num_layers) * size_t(num_experts))
    return error(Code::Internal,
                 fmt::format("load matrix holds {} values for shape {} x {}", values.size(), num_layers, num_experts));
  for (int l = 0; l < num_layers; ++l)
    for (int e = 0; e < num_experts; ++e) {
      double v = at(l, e);
      if (!std::isfinite(v) || v < 0)
        return error(Code::InvalidArgument, fmt::format("load[{}][{}] = {} is not a finite value >= 0", l, e, v));
    }
  return Status::ok();
}

}  // namespace eplb
