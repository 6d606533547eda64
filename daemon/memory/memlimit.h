/* How much memory the daemon may use (memlimit.c). */
#ifndef TENSORD_MEMLIMIT_H
#define TENSORD_MEMLIMIT_H

#include <stdint.h>

/*
 * The smallest memory cgroup limit (v2 memory.max, v1 memory.limit_in_bytes)
 * of this process's cgroup and its parents, read under root ("" for the real
 * system); UINT64_MAX when there is none.
 */
uint64_t memlimit_cgroup(const char *root);

/*
 * Shared memory (tmpfs, memfds) charged to this process's own memory
 * cgroup ("shmem" in its memory.stat, v2 or v1), read under root; UINT64_MAX
 * when unknown. Host tensors' pages are charged there, and stay there while
 * any process maps them or holds their descriptor, after the daemon let them
 * go (docs/security.md, "What a reader can pin").
 */
uint64_t memlimit_shmem(const char *root);

/* Physical memory, or the cgroup limit when that is smaller. */
uint64_t memlimit_bytes(void);

#endif /* TENSORD_MEMLIMIT_H */
