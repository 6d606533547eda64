/*
 * ENOSPC that says what holds the space: a create, put or reserve that a
 * device's capacity refuses gets, after the registry's "only F of C are
 * free on DEVICE", how much of that device unlinked tensors still hold
 * because a reader leases them, and the top holders (pid, command, label),
 * with a pointer to `tensorctl leases`. Part of the protocol layer, beside
 * inspect.c, whose rule on who sees whom it follows.
 */
#ifndef TENSORD_SPACE_H
#define TENSORD_SPACE_H

#include <stddef.h>

#include "dispatch.h"

/* Holders named at most; lease slots visited at most (a bounded walk on the loop). */
#define SPACE_TOP_HOLDERS 3
#define SPACE_SCAN_MAX 65536u

/*
 * When why (why_len bytes, NUL-terminated) is a capacity refusal of the
 * registry's (" are free on "), appends to it what unlinked-but-leased
 * tensors on device hold and who holds them, as far as why has room.
 * Holders of another uid are named only to root (as LeaseList does):
 * others read "another user's process". Nothing is appended when no
 * unlinked tensor on device is leased.
 */
void space_explain(const struct client *me, DLDevice device, char *why, size_t why_len);

#endif /* TENSORD_SPACE_H */
