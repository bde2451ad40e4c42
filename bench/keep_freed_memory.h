// keep_freed_memory.h - a benchmark setting: glibc keeps freed memory.
//
// glibc returns freed memory at the top of the heap to the kernel once more
// than M_TRIM_THRESHOLD is free (a threshold it also moves on the fly), so a
// loop that allocates and frees a result of a few hundred KiB (a placement,
// a migration plan) takes page faults for it on every call or on none,
// depending on what else the process allocated. On this VM those faults
// cost more than the computation (deepseek: 0.93 ms per call instead of
// 0.23 ms). Fixed thresholds keep freed memory, as the heap of a
// long-running serving process does, so the benchmarks time the code and
// not the kernel. Call first thing in main().
#pragma once

#include <malloc.h>

namespace eplb::bench {

inline void keep_freed_memory() {
  mallopt(M_MMAP_THRESHOLD, 256 << 20);
  mallopt(M_TRIM_THRESHOLD, 512 << 20);
}

}  // namespace eplb::bench
