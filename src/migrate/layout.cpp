// layout.cpp - StoreLayout (tensors per layer), its wire encoding and the
// cross-rank layout comparison.
#include <fmt/format.h>
#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdlib>
#include <set>
#include <string>

#include "common/bytes.h"
#include "eplb/migrate.h"

namespace eplb {
namespace {
constexpr std::string_view kLayoutMagic = "EPLBLAYOUT";
constexpr uint32_t kLayoutVersion = 2;
constexpr uint32_t kMaxDims = 8;
constexpr uint64_t kMaxDtype = 32;
constexpr uint32_t kMaxLayers = 1u << 16;
constexpr uint32_t kMaxTensors = 256;
constexpr uint64_t kMaxName = 128;
constexpr uint32_t kMaxSlotsPerRank = 1u << 20;

}  // namespace

StoreLayout StoreLayout::uniform(int num_layers, int slots_per_rank, const std::vector<TensorSpec>& tensors) {
  StoreLayout layout;
  layout.slots_per_rank = slots_per_rank;
  layout.layers.assign(static_cast<size_t>(std::max(0, num_layers)), tensors);
  return layout;
}

uint64_t StoreLayout::bytes_per_expert(int layer) const {
  uint64_t sum = 0;
  for (const auto& tensor : layers[layer]) sum += tensor.bytes_per_expert;
  return sum;
}

uint64_t StoreLayout::layer_bytes(int layer) const { return bytes_per_expert(layer) * uint64_t(slots_per_rank); }

uint64_t StoreLayout::total_bytes() const {
  uint64_t sum = 0;
  for (int l = 0; l < num_layers(); ++l) sum += layer_bytes(l);
  return sum;
}

uint64_t StoreLayout::max_layer_bytes() const {
  uint64_t most = 0;
  for (int l = 0; l < num_layers(); ++l) most = std::max(most, layer_bytes(l));
  return most;
}

Status StoreLayout::validate() const {
  if (slots_per_rank <= 0 || uint32_t(slots_per_rank) > kMaxSlotsPerRank)
    return error(Code::InvalidArgument, fmt::format("expert store layout: slots per rank must be in [1, {}], got {}",
                                                    kMaxSlotsPerRank, slots_per_rank));
  if (layers.empty() || layers.size() > kMaxLayers)
    return error(Code::InvalidArgument,
                 fmt::format("expert store layout: needs 1..{} layers, got {}", kMaxLayers, layers.size()));
  for (size_t l = 0; l < layers.size(); ++l) {
    const auto& tensors = layers[l];
    if (tensors.empty() || tensors.size() > kMaxTensors)
      return error(Code::InvalidArgument, fmt::format("expert store layout: layer {} has {} tensors (need 1..{})", l,
                                                      tensors.size(), kMaxTensors));
    std::set<std::string> names;
    for (const auto& tensor : tensors) {
      if (tensor.name.empty() || tensor.name.size() > kMaxName)
        return error(Code::InvalidArgument,
                     fmt::format("expert store layout: layer {}: tensor names must be 1..{} characters", l, kMaxName));
      if (!names.insert(tensor.name).second)
        return error(Code::InvalidArgument,
                     fmt::format("expert store layout: layer {} names tensor '{}' twice", l, tensor.name));
      if (tensor.bytes_per_expert == 0 || tensor.bytes_per_expert > (uint64_t(1) << 40))
        return error(
            Code::InvalidArgument,
            fmt::format("expert store layout: layer {} tensor '{}' has {} bytes per expert (need 1 B .. 1 TiB)", l,
                        tensor.name, tensor.bytes_per_expert));
    }
  }
  return Status::ok();
}

std::string StoreLayout::encode() const {
  bytes::Writer writer;
  writer.raw(kLayoutMagic);
  writer.u32(kLayoutVersion);
  writer.u32(uint32_t(slots_per_rank));
  writer.u32(uint32_t(layers.size()));
  for (const auto& tensors : layers) {
    writer.u32(uint32_t(tensors.size()));
    for (const auto& tensor : tensors) {
      writer.blob(tensor.name);
      writer.u64(tensor.bytes_per_expert);
      writer.blob(tensor.dtype);
      writer.u32(uint32_t(tensor.shape.size()));
      for (int64_t extent : tensor.shape) writer.u64(uint64_t(extent));
    }
  }
  return writer.take();
}

Result<StoreLayout> StoreLayout::decode(std::string_view message) {
  bytes::Reader reader(message);
  auto bad = [&](const std::string& what) {
    return error(Code::Mismatch, fmt::format("expert store layout message ({} bytes) is malformed at byte {}: {}",
                                             message.size(), reader.position(), what));
  };
  if (!reader.expect(kLayoutMagic)) return bad("bad magic");
  uint32_t version = reader.u32();
  if (!reader.ok()) return bad("truncated");
  if (version != kLayoutVersion) return bad(fmt::format("version {}, expected {}", version, kLayoutVersion));
  StoreLayout layout;
  uint32_t slots = reader.u32();
  uint32_t num_layers = reader.u32();
  if (!reader.ok()) return bad("truncated");
  if (slots == 0 || slots > kMaxSlotsPerRank) return bad(fmt::format("slots per rank {}", slots));
  if (num_layers == 0 || num_layers > kMaxLayers) return bad(fmt::format("layer count {}", num_layers));
  layout.slots_per_rank = int(slots);
  layout.layers.resize(num_layers);
  for (auto& tensors : layout.layers) {
    uint32_t count = reader.u32();
    if (!reader.ok()) return bad("truncated");
    if (count == 0 || count > kMaxTensors) return bad(fmt::format("tensor count {}", count));
    tensors.resize(count);
    for (auto& tensor : tensors) {
      tensor.name = std::string(reader.blob(kMaxName));
      tensor.bytes_per_expert = reader.u64();
      tensor.dtype = std::string(reader.blob(kMaxDtype));
      const uint32_t dims = reader.u32();
      if (!reader.ok() || dims > kMaxDims) return bad("truncated tensor entry, or too many dimensions");
      for (uint32_t d = 0; d < dims; ++d) {
        const uint64_t extent = reader.u64();
        if (extent > (uint64_t(1) << 40)) return bad(fmt::format("tensor '{}' has an extent of {}", tensor.name, extent));
        tensor.shape.push_back(int64_t(extent));
      }
      if (!reader.ok()) return bad("truncated tensor entry");
    }
  }
  if (!reader.at_end()) return bad("trailing bytes");
  if (Status valid = layout.validate(); !valid) return bad(valid.message());
  return layout;
}

namespace {
// " (float32 [16, 32])", or "" when the engine gave neither.
std::string element_words(const TensorSpec& tensor) {
  if (tensor.dtype.empty() && tensor.shape.empty()) return "";
  std::string text = tensor.dtype;
  if (!tensor.shape.empty()) text += fmt::format("{}[{}]", text.empty() ? "" : " ", fmt::join(tensor.shape, ", "));
  return " (" + text + ")";
}
}  // namespace

std::string TensorSpec::describe() const {
  std::string text = "'" + name + "'";
  if (!dtype.empty()) text += " " + dtype;
  if (!shape.empty()) text += fmt::format(" [{}]", fmt::join(shape, ", "));
  return text + " (" + format_bytes(bytes_per_expert) + ")";
}

std::string StoreLayout::to_string() const {
  std::string text = fmt::format("{} layers x {} slots", layers.size(), slots_per_rank);
  if (layers.empty()) return text;
  bool uniform_layers = std::all_of(layers.begin(), layers.end(), [&](const auto& t) { return t == layers[0]; });
  text += uniform_layers ? " x [" : " x (layer 0) [";
  for (size_t t = 0; t < layers[0].size(); ++t)
    text += (t ? ", " : "") + layers[0][t].name + " " + format_bytes(layers[0][t].bytes_per_expert);
  return text + "]";
}

Status check_layouts_agree(const std::vector<std::string>& encoded_layouts) {
  if (encoded_layouts.empty()) return error(Code::Internal, "layout check with no ranks");
  std::vector<StoreLayout> layouts;
  for (size_t r = 0; r < encoded_layouts.size(); ++r) {
    auto decoded = StoreLayout::decode(encoded_layouts[r]);
    if (!decoded) return decoded.status().with_context(fmt::format("rank {}", r));
    layouts.push_back(std::move(decoded).value());
  }
  const StoreLayout& reference = layouts[0];
  const std::string hint =
      ". Every rank must hold the same expert layout (same layers, tensors and bytes per expert); "
      "start all ranks with the same layers, tensors and bytes per expert (an engine must hand in "
      "buffers of the same shape on every rank).";
  for (size_t r = 1; r < layouts.size(); ++r) {
    const StoreLayout& other = layouts[r];
    std::string rank = fmt::format("rank {}", r);
    if (other.slots_per_rank != reference.slots_per_rank)
      return error(Code::Mismatch,
                   fmt::format("expert store layout mismatch: {} has {} slots per rank, rank 0 has {}{}", rank,
                               other.slots_per_rank, reference.slots_per_rank, hint));
    if (other.num_layers() != reference.num_layers())
      return error(Code::Mismatch, fmt::format("expert store layout mismatch: {} has {} layers, rank 0 has {}{}", rank,
                                               other.num_layers(), reference.num_layers(), hint));
    for (int l = 0; l < reference.num_layers(); ++l) {
      const auto& mine = reference.layers[l];
      const auto& theirs = other.layers[l];
      std::string where = fmt::format("layer {}", l);
      if (mine.size() != theirs.size())
        return error(Code::Mismatch,
                     fmt::format("expert store layout mismatch: {} has {} tensors in {}, rank 0 has {}{}", rank,
                                 theirs.size(), where, mine.size(), hint));
      for (size_t t = 0; t < mine.size(); ++t) {
        if (mine[t].name != theirs[t].name)
          return error(Code::Mismatch,
                       fmt::format("expert store layout mismatch: {} names {} tensor {} '{}', rank 0 names it '{}'{}",
                                   rank, where, t, theirs[t].name, mine[t].name, hint));
        if (mine[t].bytes_per_expert != theirs[t].bytes_per_expert)
          return error(
              Code::Mismatch,
              fmt::format("nbytes_per_expert mismatch: {} has {} tensor '{}' of {} B per expert{}, rank 0 has {} "
                          "B{}; a READ of this expert's rows would copy the wrong number of bytes{}",
                          rank, where, theirs[t].name, theirs[t].bytes_per_expert, element_words(theirs[t]),
                          mine[t].bytes_per_expert, element_words(mine[t]), hint));
        if (mine[t].dtype != theirs[t].dtype || mine[t].shape != theirs[t].shape)
          return error(Code::Mismatch,
                       fmt::format("expert tensor mismatch: {} has {} tensor {}, rank 0 has {}: the same bytes would "
                                   "be read as other values{}",
                                   rank, where, theirs[t].describe(), mine[t].describe(), hint));
      }
    }
  }
  return Status::ok();
}

}  // namespace eplb
