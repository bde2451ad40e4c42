// fingerprint.cpp - the "do all ranks agree?" check run before any byte
// moves: every rank allgathers its named fields, every rank compares them
// with rank 0's and names the first rank and field that differ.
#include <string>

#include "eplb/migrate.h"
#include "wire.h"

namespace eplb {
namespace {
constexpr std::string_view kMagic = "EPLBFP1";
constexpr uint64_t kMaxValue = 1 << 20;

std::string shorten(const std::string& value) {
  if (value.size() <= 160) return "'" + value + "'";
  return "'" + value.substr(0, 150) + "...' (" + std::to_string(value.size()) + " chars)";
}

std::string encode(const std::vector<FingerprintField>& fields) {
  migrate_wire::Writer writer;
  writer.raw(kMagic);
  writer.u32(uint32_t(fields.size()));
  for (const auto& field : fields) {
    writer.bytes(field.name);
    writer.bytes(field.value);
  }
  return writer.take();
}

Result<std::vector<FingerprintField>> decode(std::string_view bytes, int rank) {
  migrate_wire::Reader reader(bytes);
  auto bad = [&] {
    return error(Code::Mismatch, "fingerprint message from rank " + std::to_string(rank) + " (" +
                                     std::to_string(bytes.size()) + " bytes) is malformed at byte " +
                                     std::to_string(reader.position()));
  };
  if (!reader.raw(kMagic)) return bad();
  uint32_t count = reader.u32();
  if (!reader.ok() || count > 4096) return bad();
  std::vector<FingerprintField> fields(count);
  for (auto& field : fields) {
    field.name = std::string(reader.bytes(256));
    field.value = std::string(reader.bytes(kMaxValue));
    if (!reader.ok()) return bad();
  }
  if (!reader.at_end()) return bad();
  return fields;
}
}  // namespace

Status check_fingerprint(ProcessGroup& group, const std::vector<FingerprintField>& fields, Deadline deadline) {
  auto gathered = group.allgather(encode(fields), deadline);
  if (!gathered) return gathered.status().with_context("comparing run fingerprints before any byte moves");
  const auto& all = gathered.value();
  if (all.size() != size_t(group.size()))
    return error(Code::Internal, "fingerprint allgather returned " + std::to_string(all.size()) + " entries for " +
                                     std::to_string(group.size()) + " ranks");
  EPLB_ASSIGN_OR_RETURN(auto reference, decode(all[0], 0));
  for (size_t r = 1; r < all.size(); ++r) {
    EPLB_ASSIGN_OR_RETURN(auto theirs, decode(all[r], int(r)));
    size_t common = std::min(reference.size(), theirs.size());
    for (size_t i = 0; i < common; ++i) {
      if (theirs[i].name != reference[i].name)
        return error(Code::Mismatch, "ranks disagree before any byte moved: rank " + std::to_string(r) +
                                         " sends field '" + theirs[i].name + "' where rank 0 sends '" +
                                         reference[i].name + "' (different eplb versions?)");
      if (theirs[i].value != reference[i].value)
        return error(Code::Mismatch, "ranks disagree before any byte moved: rank " + std::to_string(r) +
                                         " has " + theirs[i].name + " = " + shorten(theirs[i].value) +
                                         ", rank 0 has " + shorten(reference[i].value) +
                                         "; every rank must compute the same plan, so start all ranks with the "
                                         "same options and inputs");
    }
    if (theirs.size() != reference.size())
      return error(Code::Mismatch, "ranks disagree before any byte moved: rank " + std::to_string(r) + " sends " +
                                       std::to_string(theirs.size()) + " fingerprint fields, rank 0 sends " +
                                       std::to_string(reference.size()) + " (different eplb versions?)");
  }
  return Status::ok();
}

}  // namespace eplb
