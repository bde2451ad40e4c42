// Atomic file writes (common/files.h).
#include "files.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace eplb::files {

std::string temporary_path(std::string_view path, long pid) { return fmt::format("{}.tmp.{}", path, pid); }

Result<AtomicFile> AtomicFile::create(const std::string& path) {
  struct stat info {};
  if (path.empty()) return error(Code::IoError, "an empty output path");
  if (::stat(path.c_str(), &info) == 0 && !S_ISREG(info.st_mode))
    return error(Code::IoError, path + ": exists and is not a regular file");
  std::string temporary = temporary_path(path, ::getpid());
  int fd = ::open(temporary.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0644);
  if (fd < 0) return error(Code::IoError, fmt::format("{}: cannot create: {}", path, std::strerror(errno)));
  return AtomicFile(path, std::move(temporary), fd);
}

AtomicFile::AtomicFile(AtomicFile&& other) noexcept
    : path_(std::move(other.path_)), temporary_(std::move(other.temporary_)), fd_(other.fd_) {
  other.fd_ = -1;
  other.temporary_.clear();
}

AtomicFile::~AtomicFile() {
  if (fd_ >= 0) ::close(fd_);
  if (!temporary_.empty()) ::unlink(temporary_.c_str());
}

Status AtomicFile::fail(std::string_view what, int saved_errno) {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
  if (!temporary_.empty()) ::unlink(temporary_.c_str());
  temporary_.clear();
  return error(Code::IoError, fmt::format("{}: {}: {}", path_, what, std::strerror(saved_errno)));
}

Status AtomicFile::append(std::string_view bytes) {
  if (fd_ < 0) return error(Code::NotAllowed, path_ + ": append after commit or failure");
  size_t done = 0;
  while (done < bytes.size()) {
    ssize_t wrote = ::write(fd_, bytes.data() + done, bytes.size() - done);
    if (wrote < 0 && errno == EINTR) continue;
    if (wrote < 0) return fail(fmt::format("cannot write {} bytes", bytes.size()), errno);
    done += size_t(wrote);
  }
  return Status::ok();
}

Status AtomicFile::commit() {
  if (fd_ < 0) return error(Code::NotAllowed, path_ + ": commit after commit or failure");
  int fd = fd_;
  fd_ = -1;
  if (::close(fd) != 0) return fail("cannot close", errno);
  if (::rename(temporary_.c_str(), path_.c_str()) != 0) return fail("cannot rename into place", errno);
  temporary_.clear();
  return Status::ok();
}

Status write_atomically(const std::string& path, std::string_view bytes) {
  EPLB_ASSIGN_OR_RETURN(AtomicFile file, AtomicFile::create(path));
  EPLB_TRY(file.append(bytes));
  return file.commit();
}

}  // namespace eplb::files
