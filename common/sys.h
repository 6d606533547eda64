/*
 * Small system helpers the daemon and the client library share: writing
 * through a descriptor, and how long to poll before sleeping.
 */
#ifndef TENSORD_SYS_H
#define TENSORD_SYS_H

#include <stddef.h>
#include <stdint.h>

/*
 * Writes n bytes at offset off of fd with pwrite(), in pieces of at most
 * 1 GiB, retrying after EINTR. 0 or -errno (-EIO for a write of nothing).
 */
int td_pwrite_all(int fd, const void *data, size_t n, uint64_t off);

/*
 * How many microseconds to poll for the peer before sleeping: the default
 * (50) when this process may run on more than one CPU, 0 when it is confined
 * to one (polling would only keep the peer from running); $TENSORD_SPIN_US
 * overrides either, 0 turning polling off. Read once per process.
 */
unsigned td_spin_budget_us(void);

#endif /* TENSORD_SYS_H */
