/*
 * Replies: daemon structures turned into tensord.Reply messages and queued
 * on a connection. Knows the reply schema and struct tensor; decides
 * nothing (dispatch does). Each function sends one frame; a send failure
 * closes the connection (see conn_send()), which callers notice by c->dead.
 */
#ifndef TENSORD_REPLY_H
#define TENSORD_REPLY_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "conn.h"
#include "registry.h"

/*
 * A reply that carries only a status: 0 with an empty message for success,
 * or -errno with the one-line reason.
 */
void reply_status(struct conn *c, uint64_t req_id, int status, const char *msg);

/*
 * A lease on t. Takes ownership of fd (-1 when none: reused, or a handle
 * kind that travels as bytes): it is closed on every path. t is borrowed.
 */
void reply_lease(struct conn *c, uint64_t req_id, const struct tensor *t, uint64_t lease,
		 bool writable, bool reused, int fd);

/* What stat answers. t is borrowed. */
void reply_info(struct conn *c, uint64_t req_id, const struct tensor *t);

/* What list answers: n tensors, borrowed, in that order. -ENOMEM is answered here. */
void reply_list(struct conn *c, uint64_t req_id, struct tensor *const *v, size_t n);

/* What stats answers. */
void reply_stats(struct conn *c, uint64_t req_id, const struct registry *reg, unsigned clients,
		 uint64_t uptime_ns);

/* Descriptors the daemon holds open, counted without allocating; 0 if unknown. */
uint32_t daemon_open_fds(void);

/* The answer to a hello of the right version. */
void reply_hello(struct conn *c, uint64_t req_id);

#endif
