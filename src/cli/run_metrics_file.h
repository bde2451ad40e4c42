// run_metrics_file.h - `eplb run --metrics FILE`: rank 0's RunMetrics
// (eplb/app_metrics.h) rewritten to FILE atomically (AtomicFile: a
// temporary file beside it, renamed into place) when the run is ready and
// after every round, so that node_exporter's textfile collector (or any
// reader) sees the previous complete file or the new one, never a part.
// A failed write leaves no temporary file behind.
#pragma once

#include <memory>
#include <string>

#include "common/files.h"
#include "eplb/app.h"
#include "eplb/app_metrics.h"

namespace eplb::cli {

class MetricsFile {
 public:
  // Checks that FILE can be created (its directory exists and is writable)
  // before any work; nullptr when `path` is empty.
  static Result<std::unique_ptr<MetricsFile>> open(const std::string& path) {
    if (path.empty()) return std::unique_ptr<MetricsFile>();
    auto probe = files::AtomicFile::create(path);  // removed again: never committed
    if (!probe) return probe.status().with_context("--metrics");
    return std::make_unique<MetricsFile>(path);
  }
  explicit MetricsFile(std::string path) : path_(std::move(path)) {}

  void ready() { write(); }
  void round(const RoundSummary& round) {
    metrics_.add_round(round);
    write();
  }
  // The first write that failed, if any.
  Status finish() const { return written_.with_context("--metrics"); }

 private:
  void write() {
    Status status = files::write_atomically(path_, metrics_.render());
    if (written_ && !status) written_ = std::move(status);
  }
  std::string path_;
  RunMetrics metrics_;
  Status written_;
};

}  // namespace eplb::cli
