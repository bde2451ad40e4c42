// ProcessGroup's collectives, all built on the one primitive exchange().
#include <fmt/format.h>

#include "eplb/bootstrap.h"
#include "message.h"

namespace eplb {

std::string_view collective_name(Collective kind) {
  switch (kind) {
    case Collective::Allgather: return "allgather";
    case Collective::Barrier: return "barrier";
    case Collective::Vote: return "vote";
  }
  return "unknown collective";
}

Result<std::vector<std::string>> ProcessGroup::allgather(std::string mine, Deadline deadline) {
  EPLB_ASSIGN_OR_RETURN(auto all, exchange(Collective::Allgather, std::move(mine), deadline));
  if (all.size() != size_t(size()))
    return error(Code::Internal, fmt::format("{} group: allgather returned {} contributions for {} ranks",
                                             backend_name(), all.size(), size()));
  return all;
}

Status ProcessGroup::barrier(Deadline deadline) { return exchange(Collective::Barrier, {}, deadline).status(); }

Result<bool> ProcessGroup::vote(bool yes, const std::string& reason, Deadline deadline,
                                std::vector<std::string>* reasons) {
  EPLB_ASSIGN_OR_RETURN(auto votes, exchange(Collective::Vote, bootstrap::encode_vote(yes, reason), deadline));
  if (votes.size() != size_t(size()))
    return error(Code::Internal, fmt::format("{} group: vote returned {} ballots for {} ranks", backend_name(),
                                             votes.size(), size()));
  return bootstrap::tally_votes(votes, reasons);
}

}  // namespace eplb
