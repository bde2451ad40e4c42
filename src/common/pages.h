// common/pages.h - make memory ready for fast first use: page tables
// populated and every page touched once by this process. Internal to the
// library (not installed).
//
// Why touching matters: on a paravirtualized VM (this project's CI machines:
// PVM, shadow page tables) the first access by a process to each 4 KiB page
// traps to the hypervisor even when the kernel has already populated the
// page table (MADV_POPULATE_*). Measured here: about 5 us per page, so a
// first memcpy of 1 GiB runs at 0.4 GB/s and later ones at 16 GB/s. Doing
// that once when memory is set up keeps it out of every later transfer. On
// bare metal the touch is one cache miss per page.
//
// Contract: best effort, never fails. The range may be unaligned; whole
// pages around it are populated and touched. prepare_for_reading only reads
// (safe on memory another process writes); prepare_for_writing writes a
// zero byte into each page (inside the range) and so is only for memory whose content does not
// matter yet (fresh staging or spare buffers).
#pragma once

#include <cstddef>

namespace eplb::pages {

// The page size the kernel maps `address` with in this process
// ("KernelPageSize" of its mapping in /proc/self/smaps): 4096, or 2 MiB for
// huge pages (hugetlb, e.g. UCX's System V segments when huge pages are
// reserved). 0 when unknown (no such mapping, no procfs). Reads the file,
// so call it at setup, not per transfer.
size_t kernel_page_size(const void* address);

// MADV_POPULATE_READ, then one read per page.
void prepare_for_reading(const void* address, size_t length);
// MADV_HUGEPAGE (where the kernel allows it for this memory),
// MADV_POPULATE_WRITE, then one zero byte written per page.
void prepare_for_writing(void* address, size_t length);

}  // namespace eplb::pages
