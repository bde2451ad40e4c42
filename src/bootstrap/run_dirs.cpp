// run_dirs.cpp - the private directories of a launch and the stale sweep
// (run_dirs.h).
#include "run_dirs.h"

#include <dirent.h>
#include <fcntl.h>
#include <fmt/format.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <vector>

#include "common/text.h"

namespace eplb::bootstrap {
namespace {

constexpr const char* kOwnerFile = "owner";
constexpr const char* kSharedMemoryBase = "/dev/shm";

Result<std::string> make_private_dir(const std::string& base) {
  std::string pattern = base + "/eplb-XXXXXX";
  std::vector<char> buffer(pattern.begin(), pattern.end());
  buffer.push_back('\0');
  if (!::mkdtemp(buffer.data()))
    return error(Code::IoError, fmt::format("cannot create a private directory {}: {}", pattern, std::strerror(errno)));
  std::string dir(buffer.data());
  std::ofstream owner(dir + "/" + kOwnerFile);
  owner << owner_line() << "\n";
  if (!owner.flush()) {
    std::error_code ignored;
    std::filesystem::remove_all(dir, ignored);
    return error(Code::IoError, fmt::format("cannot write {}/{}", dir, kOwnerFile));
  }
  return dir;
}

// The owner file's first line, at most 64 bytes; "" when absent.
std::string read_owner(const std::string& dir) {
  int fd = ::open((dir + "/" + kOwnerFile).c_str(), O_RDONLY | O_NONBLOCK | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) return "";
  char buffer[64];
  ssize_t got = ::read(fd, buffer, sizeof buffer);
  ::close(fd);
  if (got <= 0) return "";
  std::string text(buffer, size_t(got));
  return text.substr(0, text.find('\n'));
}

// True when `dir` is a real directory of this user named eplb-*.
bool is_own_run_dir(const std::string& dir) {
  struct stat info;
  return ::lstat(dir.c_str(), &info) == 0 && S_ISDIR(info.st_mode) && info.st_uid == ::geteuid();
}

// "<pid> <start time> <pid namespace>" names a process of our namespace
// that no longer exists (or whose pid now belongs to another process).
bool owner_is_gone(const std::string& owner) {
  auto fields = text::split(owner, ' ');
  if (fields.size() != 3 || fields[2] != pid_namespace()) return false;
  auto pid = text::parse_int_in(fields[0], "owner pid", 1, 1 << 22);
  if (!pid) return false;
  return process_identity(pid_t(*pid)) != fmt::format("{} {}", fields[0], fields[1]);
}

}  // namespace

std::string rendezvous_base() {
  if (const char* tmp = std::getenv("TMPDIR"); tmp && *tmp && std::strlen(tmp) < 60) return tmp;
  return "/tmp";
}

std::vector<std::string> process_stat_fields(pid_t pid) {
  std::ifstream file(fmt::format("/proc/{}/stat", pid));
  std::string stat;
  if (!std::getline(file, stat)) return {};
  // The command (field 2) may hold spaces and parentheses: split after its last ')'.
  size_t close = stat.rfind(')');
  if (close == std::string::npos || close + 2 > stat.size()) return {};
  std::vector<std::string> fields;
  for (std::string_view field : text::split(std::string_view(stat).substr(close + 2), ' ')) fields.emplace_back(field);
  return fields;
}

std::string process_identity(pid_t pid) {
  std::vector<std::string> fields = process_stat_fields(pid);
  if (fields.size() < 20) return "";
  return fmt::format("{} {}", pid, fields[19]);
}

std::string pid_namespace() {
  std::error_code failed;
  std::string link = std::filesystem::read_symlink("/proc/self/ns/pid", failed).string();
  return failed ? "pid:unknown" : link;
}

std::string owner_line() { return process_identity(::getpid()) + " " + pid_namespace(); }

Result<std::unique_ptr<RunDirs>> RunDirs::create() {
  auto dirs = std::make_unique<RunDirs>();
  EPLB_ASSIGN_OR_RETURN(dirs->rendezvous_, make_private_dir(rendezvous_base()));
  struct stat info;
  if (::stat(kSharedMemoryBase, &info) == 0 && ::access(kSharedMemoryBase, W_OK) == 0) {
    auto scratch = make_private_dir(kSharedMemoryBase);
    if (scratch) dirs->shared_memory_ = *scratch;
  }
  return dirs;
}

RunDirs::~RunDirs() {
  std::error_code ignored;
  if (!rendezvous_.empty()) std::filesystem::remove_all(rendezvous_, ignored);
  if (!shared_memory_.empty()) std::filesystem::remove_all(shared_memory_, ignored);
}

int sweep_stale_run_dirs(const std::vector<std::string>& bases) {
  int removed = 0;
  for (const auto& base : bases) {
    std::unique_ptr<DIR, int (*)(DIR*)> listing(::opendir(base.c_str()), ::closedir);
    if (!listing) continue;
    while (dirent* entry = ::readdir(listing.get())) {
      if (std::strncmp(entry->d_name, "eplb-", 5) != 0) continue;
      const std::string dir = base + "/" + entry->d_name;
      if (!is_own_run_dir(dir)) continue;
      const std::string owner = read_owner(dir);
      if (owner.empty() || !owner_is_gone(owner)) continue;
      std::error_code ignored;
      if (std::filesystem::remove_all(dir, ignored) > 0) ++removed;
    }
  }
  return removed;
}

}  // namespace eplb::bootstrap
