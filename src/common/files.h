// common/files.h - a file written atomically: created as a temporary file
// beside its final path, appended to, then renamed into place. Internal to
// the library and its applications (not installed).
//
// Contract: create() fails at once (IoError naming the path and the reason)
// when the directory is missing or not writable, or the path names something
// other than a regular file, so that callers can check an output path before
// any work. Until commit(), readers of `path` see the previous file (or
// none); a file destroyed without commit() removes its temporary file. A
// process killed before commit() leaves "<path>.tmp.<pid>" behind.
#pragma once

#include <string>
#include <string_view>

#include "eplb/status.h"

namespace eplb::files {

// "<path>.tmp.<pid>": the temporary file an AtomicFile of process `pid`
// writes before it renames it to `path` (a launcher finds a rank's with it).
std::string temporary_path(std::string_view path, long pid);

class AtomicFile {
 public:
  static Result<AtomicFile> create(const std::string& path);
  AtomicFile(AtomicFile&& other) noexcept;
  AtomicFile& operator=(AtomicFile&&) = delete;
  ~AtomicFile();

  const std::string& path() const { return path_; }
  Status append(std::string_view bytes);
  // Closes the temporary file and renames it to `path`.
  Status commit();

 private:
  AtomicFile(std::string path, std::string temporary, int fd)
      : path_(std::move(path)), temporary_(std::move(temporary)), fd_(fd) {}
  Status fail(std::string_view what, int saved_errno);
  std::string path_, temporary_;
  int fd_ = -1;
};

// Writes `bytes` to `path` through an AtomicFile.
Status write_atomically(const std::string& path, std::string_view bytes);

}  // namespace eplb::files
