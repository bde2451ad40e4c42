// The tensors of a simulated expert: the default split and the "tensors"
// spec ("gate_up:2MiB,down:1MiB,scales:8KiB").
#include <fmt/format.h>

#include <algorithm>
#include <cctype>

#include "common/text.h"
#include "eplb/app.h"

namespace eplb {
namespace {
constexpr size_t kMaxTensors = 256;
constexpr std::string_view kExample = "example: gate_up:2MiB,down:1MiB,scales:8KiB";
}  // namespace

std::vector<TensorSpec> default_tensors(uint64_t bytes_per_expert) {
  if (bytes_per_expert < 3072) return {{"weight", bytes_per_expert}};
  uint64_t scales = std::max<uint64_t>(64, (bytes_per_expert / 256 + 63) / 64 * 64);
  uint64_t rest = bytes_per_expert - scales;
  uint64_t down = rest / 3 / 64 * 64;
  uint64_t gate_up = rest - down;
  return {{"gate_up", gate_up}, {"down", down}, {"scales", scales}};
}

Result<std::vector<TensorSpec>> parse_tensors(std::string_view spec) {
  std::vector<TensorSpec> tensors;
  for (std::string_view item : text::split(spec, ',')) {
    const size_t colon = item.find(':');
    if (item.empty() || colon == std::string_view::npos || colon == 0 || colon + 1 == item.size())
      return error(Code::InvalidArgument, fmt::format("'{}' is not name:bytes ({})", item, kExample));
    const std::string name(item.substr(0, colon));
    if (!std::all_of(name.begin(), name.end(), [](char c) {
          return std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-' || c == '.';
        }))
      return error(Code::InvalidArgument,
                   fmt::format("tensor name '{}' may only hold letters, digits, '_', '-' and '.'", name));
    auto bytes = parse_byte_size(item.substr(colon + 1));
    if (!bytes) return bytes.status().with_context(fmt::format("tensor '{}'", name));
    if (std::any_of(tensors.begin(), tensors.end(), [&](const TensorSpec& tensor) { return tensor.name == name; }))
      return error(Code::InvalidArgument, fmt::format("tensor '{}' is named twice", name));
    tensors.push_back({name, *bytes});
  }
  if (tensors.size() > kMaxTensors)
    return error(Code::InvalidArgument, fmt::format("{} tensors, at most {}", tensors.size(), kMaxTensors));
  return tensors;
}

}  // namespace eplb
