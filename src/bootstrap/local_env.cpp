// How a rank started by launch_local_ranks finds its group: EPLB_RANK,
// EPLB_SIZE and EPLB_BOOTSTRAP_DIR, each validated.
#include <sys/stat.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "common/text.h"
#include "eplb/bootstrap.h"

namespace eplb {
namespace {

Result<int> parse_env_int(const char* name, const char* value, int low, int high) {
  if (!value || !*value) return error(Code::InvalidArgument, std::string(name) + " is empty");
  EPLB_ASSIGN_OR_RETURN(int64_t parsed, text::parse_int_in(value, name, low, high));
  return static_cast<int>(parsed);
}

// EPLB_RUN_SECRET (64 hex digits) and EPLB_LAUNCHER_PID, both optional.
Status read_launch_credentials(LocalGroupOptions& options) {
  EPLB_ASSIGN_OR_RETURN(options.secret, text::job_secret_from_environment());
  if (const char* pid = std::getenv("EPLB_LAUNCHER_PID")) {
    EPLB_ASSIGN_OR_RETURN(options.launcher_pid, parse_env_int("EPLB_LAUNCHER_PID", pid, 1, 1 << 22));
  }
  return Status::ok();
}

}  // namespace

Result<LocalGroupOptions> local_group_options_from_env() {
  const char* rank_text = std::getenv("EPLB_RANK");
  const char* size_text = std::getenv("EPLB_SIZE");
  const char* dir_text = std::getenv("EPLB_BOOTSTRAP_DIR");
  if (!rank_text && !size_text && !dir_text)
    return error(Code::NotFound, "not started by an eplb launcher: EPLB_RANK, EPLB_SIZE and EPLB_BOOTSTRAP_DIR are unset");
  if (!rank_text) return error(Code::InvalidArgument, "EPLB_RANK is not set (EPLB_SIZE/EPLB_BOOTSTRAP_DIR are)");
  if (!size_text) return error(Code::InvalidArgument, "EPLB_SIZE is not set (EPLB_RANK is)");
  LocalGroupOptions options;
  EPLB_ASSIGN_OR_RETURN(options.size, parse_env_int("EPLB_SIZE", size_text, 1, 65536));
  EPLB_ASSIGN_OR_RETURN(options.rank, parse_env_int("EPLB_RANK", rank_text, 0, options.size - 1));
  if (options.size > 1) {
    if (!dir_text || !*dir_text)
      return error(Code::InvalidArgument, "EPLB_BOOTSTRAP_DIR is not set (needed for EPLB_SIZE=" +
                                              std::string(size_text) + ")");
    struct stat info;
    if (::stat(dir_text, &info) != 0)
      return error(Code::InvalidArgument, std::string("EPLB_BOOTSTRAP_DIR='") + dir_text + "': " + std::strerror(errno));
    if (!S_ISDIR(info.st_mode))
      return error(Code::InvalidArgument, std::string("EPLB_BOOTSTRAP_DIR='") + dir_text + "' is not a directory");
    options.rendezvous_dir = dir_text;
  } else if (dir_text) {
    options.rendezvous_dir = dir_text;
  }
  EPLB_TRY(read_launch_credentials(options));
  if (const char* timeout_text = std::getenv("EPLB_BOOTSTRAP_TIMEOUT")) {
    auto seconds = text::parse_double(timeout_text, "EPLB_BOOTSTRAP_TIMEOUT");
    if (!seconds || !(*seconds > 0) || *seconds > 86400)
      return error(Code::InvalidArgument, std::string("EPLB_BOOTSTRAP_TIMEOUT='") + timeout_text +
                                              "' is not a number of seconds in (0, 86400]");
    options.connect_timeout_seconds = *seconds;
  }
  return options;
}

}  // namespace eplb
