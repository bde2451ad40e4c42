// run_report_rescue.h - the launcher's last word on `eplb run --json`: when a
// launch ends with rank 0 gone before it renamed its report into place (a
// SIGINT/SIGTERM forwarded to the ranks, a killed rank 0), the launcher
// closes rank 0's "<path>.tmp.<pid>" (head and the rounds so far) with a
// tail marked "interrupted": true, renames it into place and so leaves no
// temporary file. A round line cut short by the signal is dropped.
#pragma once

#include <string>

#include "eplb/status.h"

namespace eplb::cli {

// Does nothing when `path` is empty or rank 0 left no temporary file.
// `reason` (the launch's status) becomes the report's "status".
Status rescue_report(const std::string& path, int rank0_pid, const Status& reason);

}  // namespace eplb::cli
