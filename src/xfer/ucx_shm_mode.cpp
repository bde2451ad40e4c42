// ucx_shm_mode.cpp - UCX 1.13 creates its System V shared-memory segments
// (the sysv transport's FIFOs and ucp_mem_map allocations) with mode 0660,
// hard-coded: another user of the group could write into them. After UCX
// creates segments, this process narrows its own to 0600 (IPC_SET); the
// peers that attach them run as the same user. Posix files need nothing:
// UCX creates them 0600 (inside the caller's private UCX_POSIX_DIR).
#include <sys/ipc.h>
#include <sys/shm.h>
#include <unistd.h>

#include <fstream>
#include <sstream>
#include <string>

#include "ucx_internal.h"

namespace eplb::xfer::ucx {

int restrict_own_sysv_segments() {
  std::ifstream table("/proc/sysvipc/shm");
  std::string line;
  std::getline(table, line);  // the column names
  int narrowed = 0;
  const long me = long(::getpid());
  while (std::getline(table, line)) {
    std::istringstream fields(line);
    long key = 0, shmid = -1, size = 0, creator = 0;
    unsigned mode = 0;
    if (!(fields >> key >> shmid >> std::oct >> mode >> std::dec >> size >> creator)) continue;
    if (creator != me || (mode & 077) == 0) continue;
    shmid_ds info{};
    if (::shmctl(int(shmid), IPC_STAT, &info) != 0 || info.shm_perm.uid != ::geteuid()) continue;
    info.shm_perm.mode = 0600;
    if (::shmctl(int(shmid), IPC_SET, &info) == 0) ++narrowed;
  }
  return narrowed;
}

}  // namespace eplb::xfer::ucx
