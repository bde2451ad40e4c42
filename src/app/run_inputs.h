// run_inputs.h (internal to src/app) - what a rank of `eplb run` needs
// before anything moves, checked against every other rank's.
#pragma once

#include <memory>
#include <string>

#include "eplb/app.h"
#include "eplb/policy.h"

namespace eplb {

struct RunInputs {
  StoreLayout layout;
  LoadTrace trace;
  std::string trace_identity;
  std::unique_ptr<Policy> policy;
};

// Collective: prepares this rank's inputs and compares every rank's
// fingerprint (topology, policy, options, layout, trace identity,
// transports). A local failure is announced to the others through the
// fingerprint, so that every rank stops with the same explanation.
Result<RunInputs> prepare_and_agree(ProcessGroup& group, const RunOptions& options, Deadline deadline);

// The fault spec of `rank`: ranks draw independent fault sequences (the
// spec's seed, default 0, plus the rank number).
Result<std::string> rank_fault_spec(const std::string& spec, int rank);

}  // namespace eplb
