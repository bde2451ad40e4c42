// Placement JSON: the topology plus phy2log [L][R], log2phy [L][E][K] and
// logcnt [L][E], one row per line, with optional extra top-level keys.
//
// The reader treats the file as untrusted: nesting depth is checked before
// the DOM is built, every array's length is checked against the topology
// before anything is allocated from it, every entry must be an int32, and the
// result must pass Topology::validate and every Placement invariant. Errors
// name the file and the key path (phy2log[3][7]).
#include <climits>
#include <nlohmann/json.hpp>
#include <string>

#include <fmt/format.h>

#include "eplb/placement_io.h"
#include "io_util.h"

namespace eplb {
namespace {

using io::file_error;
using json = nlohmann::json;

constexpr int kMaxDepth = 32;
const char* const kReservedKeys[] = {"topology", "phy2log", "log2phy", "logcnt"};

bool reserved(const std::string& key) {
  for (const char* name : kReservedKeys)
    if (key == name) return true;
  return false;
}

void append_int_row(std::string& out, std::span<const int32_t> row) {
  out += '[';
  for (size_t i = 0; i < row.size(); ++i) {
    if (i) out += ", ";
    fmt::format_to(std::back_inserter(out), "{}", row[i]);
  }
  out += ']';
}

// Depth of [ and { nesting outside strings; the byte where it first exceeds `limit`, or npos.
size_t too_deep_at(std::string_view text, int limit) {
  int depth = 0;
  bool in_string = false, escaped = false;
  for (size_t i = 0; i < text.size(); ++i) {
    char c = text[i];
    if (in_string) {
      if (escaped) escaped = false;
      else if (c == '\\') escaped = true;
      else if (c == '"') in_string = false;
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      if (++depth > limit) return i;
    } else if (c == ']' || c == '}') {
      --depth;
    }
  }
  return std::string_view::npos;
}

class Reader {
 public:
  explicit Reader(std::string_view name) : name_(name) {}

  Status fail(const std::string& path, const std::string& what) const {
    return file_error(Code::ParseError, name_, path + ": " + what);
  }

  Result<int32_t> integer(const json& value, const std::string& path) const {
    if (!value.is_number_integer()) return fail(path, std::string("expected an integer, found ") + value.type_name());
    if (value.is_number_unsigned()) {
      uint64_t v = value.get<uint64_t>();
      if (v > uint64_t(INT32_MAX)) return fail(path, fmt::format("{} is out of range", v));
      return int32_t(v);
    }
    int64_t v = value.get<int64_t>();
    if (v > INT32_MAX || v < INT32_MIN) return fail(path, fmt::format("{} is out of range", v));
    return int32_t(v);
  }

  Status array_of(const json& value, const std::string& path, size_t expected, const char* what) const {
    if (!value.is_array()) return fail(path, std::string("expected an array, found ") + value.type_name());
    if (value.size() != expected)
      return fail(path, fmt::format("holds {} entries, expected {} ({})", value.size(), expected, what));
    return Status::ok();
  }

  // A [rows][columns] integer matrix appended to `out`.
  Status matrix(const json& root, const char* key, size_t rows, size_t columns, const char* row_what,
                const char* column_what, std::vector<int32_t>& out) const {
    auto found = root.find(key);
    if (found == root.end()) return fail(key, "missing");
    EPLB_TRY(array_of(*found, key, rows, row_what));
    out.reserve(rows * columns);
    for (size_t r = 0; r < rows; ++r) {
      std::string row_path = fmt::format("{}[{}]", std::string(key), r);
      const json& row = (*found)[r];
      EPLB_TRY(array_of(row, row_path, columns, column_what));
      for (size_t c = 0; c < columns; ++c) {
        EPLB_ASSIGN_OR_RETURN(int32_t value, integer(row[c], fmt::format("{}[{}]", row_path, c)));
        out.push_back(value);
      }
    }
    return Status::ok();
  }

 private:
  std::string_view name_;
};

}  // namespace

std::string placement_to_json(const Placement& placement, const Topology& topology,
                              const std::string& extra_json_object) {
  std::string out = fmt::format(
      "{{\n  \"topology\": {{\"layers\": {}, \"experts\": {}, \"slots\": {}, \"groups\": {}, \"nodes\": {}, \"ranks\": "
      "{}}},\n",
      topology.num_layers, topology.num_experts, topology.num_slots, topology.num_groups, topology.num_nodes,
      topology.num_ranks);
  out += "  \"phy2log\": [\n";
  for (int l = 0; l < placement.num_layers(); ++l) {
    out += "    ";
    append_int_row(out, placement.layer_phy2log(l));
    out += l + 1 < placement.num_layers() ? ",\n" : "\n";
  }
  out += "  ],\n  \"log2phy\": [\n";
  const int replicas = placement.max_replicas();
  for (int l = 0; l < placement.num_layers(); ++l) {
    out += "    [";
    for (int e = 0; e < placement.num_experts(); ++e) {
      if (e) out += ", ";
      append_int_row(out, std::span<const int32_t>(
                              placement.log2phy_data().data() + (size_t(l) * placement.num_experts() + e) * replicas,
                              size_t(replicas)));
    }
    out += l + 1 < placement.num_layers() ? "],\n" : "]\n";
  }
  out += "  ],\n  \"logcnt\": [\n";
  for (int l = 0; l < placement.num_layers(); ++l) {
    out += "    ";
    append_int_row(out, placement.layer_logcnt(l));
    out += l + 1 < placement.num_layers() ? ",\n" : "\n";
  }
  out += "  ]";
  // Extra keys (policy, metrics, ...): an invalid or non-object `extra` is
  // dropped here (write_placement_file reports it); reserved keys are skipped.
  json extra = json::parse(extra_json_object, nullptr, false);
  if (!extra.is_discarded() && extra.is_object())
    for (auto it = extra.begin(); it != extra.end(); ++it) {
      if (reserved(it.key())) continue;
      out += ",\n  " + json(it.key()).dump() + ": " + it.value().dump();
    }
  out += "\n}\n";
  return out;
}

Status write_placement_file(const std::string& path, const Placement& placement, const Topology& topology,
                            const std::string& extra_json_object) {
  json extra = json::parse(extra_json_object, nullptr, false);
  if (extra.is_discarded() || !extra.is_object())
    return file_error(Code::InvalidArgument, path, "the extra keys must be a JSON object, got '" +
                                                        extra_json_object.substr(0, 60) + "'");
  for (auto it = extra.begin(); it != extra.end(); ++it)
    if (reserved(it.key()))
      return file_error(Code::InvalidArgument, path, "extra key \"" + it.key() + "\" is reserved");
  EPLB_TRY(placement.validate_against(topology).with_context(path + ": refusing to write"));
  return io::write_file(path, placement_to_json(placement, topology, extra_json_object));
}

namespace {

// The document's root, bounded in depth, or the parser's complaint with its byte.
Result<json> parse_root(std::string_view text, std::string_view name) {
  if (text.find_first_not_of(" \t\r\n") == std::string_view::npos)
    return file_error(Code::ParseError, name, "empty file (expected a placement JSON object)");
  size_t deep = too_deep_at(text, kMaxDepth);
  if (deep != std::string_view::npos)
    return file_error(Code::ParseError, name, fmt::format("byte {}: nested deeper than {} levels", deep, kMaxDepth));
  try {
    json root = json::parse(text.begin(), text.end());
    if (!root.is_object())
      return file_error(Code::ParseError, name,
                        fmt::format("the top level is {}, expected an object with topology, "
                                    "phy2log, log2phy, logcnt",
                                    root.type_name()));
    return root;
  } catch (const json::parse_error& problem) {
    std::string what = problem.what();
    size_t bracket = what.find("] ");
    if (bracket != std::string::npos) what = what.substr(bracket + 2);
    if (what.rfind("parse error at ", 0) == 0) what = what.substr(15);
    return file_error(Code::ParseError, name, fmt::format("byte {}: {}", problem.byte, what));
  } catch (const std::exception& problem) {
    return file_error(Code::ParseError, name, std::string("cannot parse: ") + problem.what());
  }
}

Result<Topology> read_topology(const json& root, Reader& reader) {
  auto entry = root.find("topology");
  if (entry == root.end()) return reader.fail("topology", "missing");
  if (!entry->is_object())
    return reader.fail("topology", std::string("expected an object, found ") + entry->type_name());
  Topology topology;
  const std::pair<const char*, int*> fields[] = {{"layers", &topology.num_layers}, {"experts", &topology.num_experts},
                                                 {"slots", &topology.num_slots},   {"groups", &topology.num_groups},
                                                 {"nodes", &topology.num_nodes},   {"ranks", &topology.num_ranks}};
  for (const auto& [key, target] : fields) {
    std::string path = std::string("topology.") + key;
    auto field = entry->find(key);
    if (field == entry->end()) return reader.fail(path, "missing");
    EPLB_ASSIGN_OR_RETURN(*target, reader.integer(*field, path));
  }
  Status valid = topology.validate();
  if (!valid.is_ok()) return reader.fail("topology", valid.message());
  return topology;
}

// log2phy[L][E][replicas], the replica width set by its first entry.
Status read_log2phy(const json& root, const Topology& t, Reader& reader, std::vector<int32_t>& log2phy,
                    size_t* replicas) {
  auto entry = root.find("log2phy");
  if (entry == root.end()) return reader.fail("log2phy", "missing");
  EPLB_TRY(reader.array_of(*entry, "log2phy", size_t(t.num_layers), "one entry per layer"));
  for (size_t l = 0; l < size_t(t.num_layers); ++l) {
    const std::string layer_path = fmt::format("log2phy[{}]", l);
    const json& layer = (*entry)[l];
    EPLB_TRY(reader.array_of(layer, layer_path, size_t(t.num_experts), "one entry per expert"));
    for (size_t e = 0; e < size_t(t.num_experts); ++e) {
      const std::string expert_path = fmt::format("{}[{}]", layer_path, e);
      const json& slots = layer[e];
      if (!slots.is_array())
        return reader.fail(expert_path, std::string("expected an array of slots, found ") + slots.type_name());
      if (*replicas == 0) {
        if (slots.empty() || slots.size() > size_t(t.num_slots))
          return reader.fail(expert_path, fmt::format("holds {} entries; the replica width must be in [1, slots={}]",
                                                      slots.size(), t.num_slots));
        *replicas = slots.size();
        log2phy.reserve(size_t(t.num_layers) * size_t(t.num_experts) * *replicas);
      }
      EPLB_TRY(reader.array_of(slots, expert_path, *replicas, "the replica width of log2phy[0][0]"));
      for (size_t k = 0; k < *replicas; ++k) {
        EPLB_ASSIGN_OR_RETURN(int32_t slot, reader.integer(slots[k], fmt::format("{}[{}]", expert_path, k)));
        log2phy.push_back(slot);
      }
    }
  }
  return Status::ok();
}

}  // namespace

Result<PlacementFile> parse_placement_json(std::string_view text, std::string_view name) {
  EPLB_ASSIGN_OR_RETURN(json root, parse_root(text, name));
  Reader reader(name);
  PlacementFile file;
  EPLB_ASSIGN_OR_RETURN(file.topology, read_topology(root, reader));
  const Topology& t = file.topology;
  std::vector<int32_t> phy2log, logcnt, log2phy;
  EPLB_TRY(reader.matrix(root, "phy2log", size_t(t.num_layers), size_t(t.num_slots), "one row per layer",
                         "one entry per slot", phy2log));
  EPLB_TRY(reader.matrix(root, "logcnt", size_t(t.num_layers), size_t(t.num_experts), "one row per layer",
                         "one entry per expert", logcnt));
  size_t replicas = 0;
  EPLB_TRY(read_log2phy(root, t, reader, log2phy, &replicas));
  auto placement = Placement::from_arrays(t.num_layers, t.num_experts, t.num_slots, int(replicas),
                                          std::move(phy2log), std::move(log2phy), std::move(logcnt));
  if (!placement.is_ok())
    return file_error(Code::ParseError, name, "phy2log/log2phy/logcnt are inconsistent: " +
                                                  placement.status().message());
  file.placement = std::move(placement).value();
  return file;
}

Result<PlacementFile> read_placement_file(const std::string& path, uint64_t max_text_bytes) {
  EPLB_ASSIGN_OR_RETURN(std::vector<uint8_t> bytes, io::read_text_input(path, max_text_bytes));
  return parse_placement_json(std::string_view(reinterpret_cast<const char*>(bytes.data()), bytes.size()), path);
}

}  // namespace eplb
