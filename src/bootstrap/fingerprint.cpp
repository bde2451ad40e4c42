// check_fingerprint: the "do all ranks agree?" check run before any byte
// moves: every rank allgathers its named fields, every rank compares them
// with rank 0's and names the first rank and field that differ.
#include <fmt/format.h>

#include <string>

#include "common/bytes.h"
#include "eplb/bootstrap.h"

namespace eplb {
namespace {

constexpr std::string_view kMagic = "EPLBFP2";
constexpr uint32_t kMaxFields = 4096;
constexpr uint64_t kMaxName = 256;
constexpr uint64_t kMaxValue = 1 << 20;

std::string shorten(const std::string& value) {
  if (value.size() <= 160) return fmt::format("'{}'", value);
  return fmt::format("'{}...' ({} chars)", value.substr(0, 150), value.size());
}

std::string encode(const std::vector<FingerprintField>& fields) {
  bytes::Writer writer;
  writer.raw(kMagic);
  writer.u32(uint32_t(fields.size()));
  for (const auto& field : fields) {
    writer.blob(field.name);
    writer.blob(field.value);
  }
  return writer.take();
}

Result<std::vector<FingerprintField>> decode(std::string_view message, int rank) {
  bytes::Reader reader(message);
  auto bad = [&] {
    return error(Code::Mismatch, fmt::format("fingerprint message from rank {} ({} bytes) is malformed at byte {}",
                                             rank, message.size(), reader.position()));
  };
  if (!reader.expect(kMagic)) return bad();
  uint32_t count = reader.u32();
  if (!reader.ok() || count > kMaxFields) return bad();
  std::vector<FingerprintField> fields(count);
  for (auto& field : fields) {
    field.name = std::string(reader.blob(kMaxName));
    field.value = std::string(reader.blob(kMaxValue));
    if (!reader.ok()) return bad();
  }
  if (!reader.at_end()) return bad();
  return fields;
}

// Mismatch naming the first field of `theirs` (rank `rank`) that differs from rank 0's.
Status compare(const std::vector<FingerprintField>& reference, const std::vector<FingerprintField>& theirs,
               size_t rank) {
  const std::string prefix = fmt::format("ranks disagree before any byte moved: rank {}", rank);
  size_t common = std::min(reference.size(), theirs.size());
  for (size_t i = 0; i < common; ++i) {
    if (theirs[i].name != reference[i].name)
      return error(Code::Mismatch, fmt::format("{} sends field '{}' where rank 0 sends '{}' (different eplb "
                                               "versions?)",
                                               prefix, theirs[i].name, reference[i].name));
    if (theirs[i].value != reference[i].value)
      return error(Code::Mismatch, fmt::format("{} has {} = {}, rank 0 has {}; every rank must compute the same "
                                               "plan, so start all ranks with the same options and inputs",
                                               prefix, theirs[i].name, shorten(theirs[i].value),
                                               shorten(reference[i].value)));
  }
  if (theirs.size() != reference.size())
    return error(Code::Mismatch, fmt::format("{} sends {} fingerprint fields, rank 0 sends {} (different eplb "
                                             "versions?)",
                                             prefix, theirs.size(), reference.size()));
  return Status::ok();
}

}  // namespace

Status check_fingerprint(ProcessGroup& group, const std::vector<FingerprintField>& fields, Deadline deadline) {
  auto gathered = group.allgather(encode(fields), deadline);
  if (!gathered) return gathered.status().with_context("comparing run fingerprints before any byte moves");
  const auto& all = gathered.value();
  EPLB_ASSIGN_OR_RETURN(auto reference, decode(all[0], 0));
  for (size_t r = 1; r < all.size(); ++r) {
    EPLB_ASSIGN_OR_RETURN(auto theirs, decode(all[r], int(r)));
    EPLB_TRY(compare(reference, theirs, r));
  }
  return Status::ok();
}

}  // namespace eplb
