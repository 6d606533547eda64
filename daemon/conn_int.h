/*
 * What conn.c (one connection: framing, the reply queue, closing) and
 * conn_set.c (the set: admission, lingering, draining, the retry timer)
 * share, and nothing else includes.
 */
#ifndef TENSORD_CONN_INT_H
#define TENSORD_CONN_INT_H

#include <stdbool.h>

#include "conn.h"

/* Polls c for what it can do now: read unless backlogged, write while queued. */
void conn_update_poll(struct conn *c);

/* The peer has read everything we sent: what was in flight has arrived. */
void conn_refresh_in_flight(struct conn *c);

/* Sends what c's socket takes of its queue. 0, or -errno: close c. */
int conn_flush(struct conn *c);

/* Whether c has as many replies waiting as we let it (then its requests wait). */
bool conn_backlogged(struct conn *c);

/* Handles the whole frames in c->in. */
void conn_process(struct conn *c);

/* Starts the retry timer unless it runs. */
void conn_retry_arm(struct conn_set *set);

/* Takes ownership of c's socket (closed on every path) and of its charges. */
void conn_drain_add(struct conn_set *set, struct conn *c);

#endif /* TENSORD_CONN_INT_H */
