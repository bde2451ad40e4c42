// The launcher's rescue of an interrupted run's --json report (see run_report_rescue.h).
#include "run_report_rescue.h"

#include <fmt/format.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>

#include "common/files.h"
#include "eplb/app.h"

namespace eplb::cli {
namespace {

constexpr std::string_view kRoundsOpen = "\"rounds\": [";

// The tail of a run that rank 0 did not end: render_json_tail, marked interrupted.
std::string interrupted_tail(const Status& reason) {
  RunSummary summary;
  summary.status = reason;
  summary.all_verified = false;
  summary.interrupted = true;
  summary.final_state = "interrupted before the run ended: the rounds listed are those that ended";
  return render_json_tail(summary);
}

// The longest prefix of `text` (cut at line ends, a trailing comma dropped)
// that the tail closes into valid JSON; else a report of no rounds.
std::string close_report(std::string text, const std::string& tail) {
  while (text.find(kRoundsOpen) != std::string::npos) {
    while (!text.empty() && (text.back() == ',' || text.back() == ' ')) text.pop_back();
    if (nlohmann::json::accept(text + tail)) return text + tail;
    const size_t line = text.rfind('\n');
    if (line == std::string::npos) break;
    text.resize(line);
  }
  return "{\n  " + std::string(kRoundsOpen) + tail;
}

}  // namespace

Status rescue_report(const std::string& path, int rank0_pid, const Status& reason) {
  if (path.empty() || rank0_pid <= 0) return Status::ok();
  const std::string temporary = files::temporary_path(path, rank0_pid);
  std::error_code failed;
  if (!std::filesystem::is_regular_file(std::filesystem::symlink_status(temporary, failed))) return Status::ok();
  std::ifstream in(temporary, std::ios::binary);
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (in.bad()) return error(Code::IoError, "--json: cannot read " + temporary);
  Status written = files::write_atomically(path, close_report(std::move(text), interrupted_tail(reason)));
  ::unlink(temporary.c_str());
  return written.with_context("--json (the interrupted run's report)");
}

}  // namespace eplb::cli
