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

/* Physical memory, or the cgroup limit when that is smaller. */
uint64_t memlimit_bytes(void);

#endif /* TENSORD_MEMLIMIT_H */
