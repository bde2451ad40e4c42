// Logical maps (vLLM's compute_logical_maps semantics) and vLLM's
// preserve_intragpu_slots, over [L][R] int64 arrays.
#include <algorithm>
#include <limits>
#include <string>
#include <vector>

#include "bindings.h"
#include "convert.h"

namespace eplb::python {
namespace {

constexpr int64_t kMaxIndex = std::numeric_limits<int32_t>::max();

// (log2phy [L][E][max replicas] with slots in ascending order and -1 padding,
// logcnt [L][E]); slots holding -1 (not yet filled) are skipped.
py::tuple logical_maps(const IndexArray& phy2log, int num_experts) {
  if (num_experts <= 0) throw_invalid("num_logical_experts must be > 0, got " + std::to_string(num_experts));
  const int64_t entries = phy2log.ndim() == 2 ? int64_t(phy2log.shape(0)) * num_experts : 0;
  if (num_experts > kMaxExpertsPerLayer || entries > kMaxTableEntries)
    throw_invalid("num_logical_experts = " + std::to_string(num_experts) + " over " +
                  std::to_string(phy2log.ndim() == 2 ? phy2log.shape(0) : 0) + " layers: at most " +
                  std::to_string(kMaxExpertsPerLayer) + " experts per layer and " + std::to_string(kMaxTableEntries) +
                  " (layers x experts) in all");
  std::vector<int32_t> values = indices_from_array(phy2log, "phy2log", -1, num_experts);
  const size_t layers = rows_of(phy2log), slots = columns_of(phy2log), experts = num_experts;
  std::vector<int32_t> counts(layers * experts, 0);
  for (size_t l = 0; l < layers; ++l)
    for (size_t s = 0; s < slots; ++s)
      if (int32_t e = values[l * slots + s]; e >= 0) ++counts[l * experts + e];
  const size_t width = counts.empty() ? 0 : size_t(*std::max_element(counts.begin(), counts.end()));
  if (double(layers) * double(experts) * double(width) > double(kMaxTableEntries))
    throw_invalid("log2phy would hold " + std::to_string(layers) + " x " + std::to_string(experts) + " x " +
                  std::to_string(width) + " entries, above the cap of " + std::to_string(kMaxTableEntries));
  std::vector<int32_t> log2phy(layers * experts * width, -1);
  std::vector<int32_t> filled(experts);
  for (size_t l = 0; l < layers; ++l) {
    std::fill(filled.begin(), filled.end(), 0);
    for (size_t s = 0; s < slots; ++s)
      if (int32_t e = values[l * slots + s]; e >= 0)
        log2phy[(l * experts + e) * width + filled[e]++] = static_cast<int32_t>(s);
  }
  auto arrays = int64_arrays({{log2phy, {py::ssize_t(layers), py::ssize_t(experts), py::ssize_t(width)}},
                              {counts, {py::ssize_t(layers), py::ssize_t(experts)}}});
  return py::make_tuple(arrays[0], arrays[1]);
}

// One rank's slots [0, count) of one layer: experts that stay keep their old
// slot (the first unused match in the new order); the rest fill the free
// slots in order.
void preserve_rank(const int32_t* new_slots, const int32_t* old_slots, int32_t* out, size_t count) {
  std::vector<char> used(count, 0), kept(count, 0);
  for (size_t slot = 0; slot < count; ++slot)
    for (size_t j = 0; j < count; ++j)
      if (!used[j] && new_slots[j] == old_slots[slot]) {
        out[slot] = new_slots[j];
        used[j] = kept[slot] = 1;
        break;
      }
  size_t next = 0;
  for (size_t slot = 0; slot < count; ++slot) {
    if (kept[slot]) continue;
    while (used[next]) ++next;
    out[slot] = new_slots[next++];
  }
}

py::array_t<int64_t> preserve_slots(const IndexArray& phy2log, int num_ranks, const IndexArray& old_phy2log) {
  std::vector<int32_t> fresh = indices_from_array(phy2log, "phy2log", -1, kMaxIndex);
  std::vector<int32_t> old = indices_from_array(old_phy2log, "old_phy2log", -1, kMaxIndex);
  const int layers = rows_of(phy2log), slots = columns_of(phy2log);
  if (rows_of(old_phy2log) != layers || columns_of(old_phy2log) != slots)
    throw StatusError(Status(Code::Mismatch, "old_phy2log is [" + std::to_string(rows_of(old_phy2log)) + "][" +
                                                 std::to_string(columns_of(old_phy2log)) + "], phy2log is [" +
                                                 std::to_string(layers) + "][" + std::to_string(slots) + "]"));
  if (num_ranks <= 0 || slots % num_ranks != 0)
    throw_invalid("num_ranks=" + std::to_string(num_ranks) + " must be > 0 and divide the " + std::to_string(slots) +
                  " slots per layer");
  const size_t per_rank = slots / num_ranks;
  std::vector<int32_t> out(fresh.size());
  for (size_t start = 0; start < fresh.size(); start += per_rank)
    preserve_rank(&fresh[start], &old[start], &out[start], per_rank);
  return int64_array(out, {layers, slots});
}

}  // namespace

void bind_maps(py::module_& module) {
  module.def("logical_maps", &logical_maps, py::arg("phy2log"), py::arg("num_experts"),
             "(log2phy, logcnt) from phy2log [L][R]; -1 slots are skipped.");
  module.def("preserve_slots", &preserve_slots, py::arg("phy2log"), py::arg("num_ranks"), py::arg("old_phy2log"),
             "phy2log reordered inside each rank so that experts that stay keep their old slots.");
}

}  // namespace eplb::python
