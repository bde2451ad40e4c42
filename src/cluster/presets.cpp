// Hardware and model presets (eplb/cluster.h); their numbers and sources are
// listed in docs/scale.md.
#include <fmt/format.h>

#include <cmath>

#include "eplb/cluster.h"

namespace eplb {

namespace {

constexpr double kGB = 1e9;
// NVLink 4: 900 GB/s per GPU both ways (H100 and H200 SXM datasheets).
constexpr double kNvlinkOneWay = 450 * kGB;
// One ConnectX-7 400 Gb/s NIC per GPU (DGX H100 / H200 system guides).
constexpr double kNic400G = 400e9 / 8;
// Fixed cost of a changed layer: the vote is one allgather of the control
// group, about a millisecond (docs/async.md, measured on CPU ranks; not
// measured on GPUs).
constexpr double kLayerOverhead = 1e-3;
// A swap commit is a buffer switch at a step boundary: assumed 50 us per
// layer in the serving thread (not measured on GPUs).
constexpr double kSwapCommit = 50e-6;

ClusterSpec gpu_host(const char* name, double hbm_bytes_per_second, const char* hbm_source) {
  ClusterSpec spec;
  spec.name = name;
  spec.ranks_per_host = 8;
  spec.links = {kNvlinkOneWay, kNic400G, 0};
  spec.copy_bytes_per_second = hbm_bytes_per_second / 2;  // a copy reads and writes every byte
  spec.layer_overhead_seconds = kLayerOverhead;
  spec.commit_seconds = kSwapCommit;
  spec.source = fmt::format("8 GPUs per host, NVLink 4 450 GB/s per GPU each way, one 400 Gb/s NIC per GPU, {}", hbm_source);
  return spec;
}

}  // namespace

Status ClusterSpec::validate() const {
  EPLB_TRY(links.validate().with_context("cluster " + name));
  if (ranks_per_host < 1) return error(Code::InvalidArgument, "cluster " + name + ": ranks per host must be >= 1");
  auto non_negative = [](double value) { return std::isfinite(value) && value >= 0; };
  if (!(std::isfinite(copy_bytes_per_second) && copy_bytes_per_second > 0))
    return error(Code::InvalidArgument, "cluster " + name + ": copy bandwidth must be finite and > 0");
  if (!non_negative(layer_overhead_seconds) || !non_negative(commit_seconds))
    return error(Code::InvalidArgument, "cluster " + name + ": overheads must be finite and >= 0 seconds");
  return Status::ok();
}

Result<ClusterSpec> cluster_preset(const std::string& name) {
  if (name == "h100") return gpu_host("h100", 3.35e12, "HBM3 3.35 TB/s (H100 SXM datasheet)");
  if (name == "h200") return gpu_host("h200", 4.8e12, "HBM3e 4.8 TB/s (H200 SXM datasheet)");
  return error(Code::InvalidArgument, "unknown cluster preset '" + name + "' (known: h100, h200)");
}

std::vector<std::string> cluster_preset_names() { return {"h100", "h200"}; }

Result<ModelSpec> model_preset(const std::string& name) {
  // Routed expert = gate, up and down projections: 3 x hidden x moe_intermediate weights.
  if (name == "deepseek-v3")
    return ModelSpec{name, 58, 256, 8, 3.0 * 7168 * 2048,
                     "DeepSeek-V3/R1 config.json: 61 layers, first 3 dense; 256 routed experts, 8 groups; hidden "
                     "7168, moe_intermediate 2048; FP8 weights (1 byte)"};
  if (name == "kimi-k2")
    return ModelSpec{name, 60, 384, 1, 3.0 * 7168 * 2048,
                     "Kimi-K2 config.json: 61 layers, first 1 dense; 384 routed experts, 1 group; hidden 7168, "
                     "moe_intermediate 2048; FP8 weights (1 byte)"};
  if (name == "qwen3-235b")
    return ModelSpec{name, 94, 128, 1, 3.0 * 4096 * 1536 * 2,
                     "Qwen3-235B-A22B config.json: 94 layers, all MoE; 128 experts; hidden 4096, "
                     "moe_intermediate 1536; BF16 weights (2 bytes)"};
  return error(Code::InvalidArgument, "unknown model preset '" + name + "' (known: deepseek-v3, kimi-k2, qwen3-235b)");
}

std::vector<std::string> model_preset_names() { return {"deepseek-v3", "kimi-k2", "qwen3-235b"}; }

Result<Topology> cluster_topology(const ModelSpec& model, int ranks, int ranks_per_host) {
  if (ranks < 1 || ranks_per_host < 1)
    return error(Code::InvalidArgument, fmt::format("ranks ({}) and ranks per host ({}) must be >= 1", ranks, ranks_per_host));
  const int hosts = ranks <= ranks_per_host ? 1 : ranks / ranks_per_host;
  if (hosts * std::min(ranks, ranks_per_host) != ranks)
    return error(Code::InvalidArgument,
                 fmt::format("{} ranks do not fill hosts of {} ranks", ranks, ranks_per_host));
  const int64_t wanted = (int64_t(model.experts) * 9 + 7) / 8;
  const int64_t slots = (wanted + ranks - 1) / ranks * ranks;
  Topology topology{model.layers, model.experts, int(slots), model.groups, hosts, ranks};
  if (model.groups % hosts != 0) topology.num_groups = 1;  // DeepSeek's global variant
  EPLB_TRY(topology.validate().with_context("model " + model.name));
  return topology;
}

}  // namespace eplb
