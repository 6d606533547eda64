/*
 * Watches (watch.c): what dispatch and the connections tell them. Their
 * requests are dispatch_do_watch() and dispatch_do_unwatch()
 * (dispatch_int.h).
 */
#ifndef TENSORD_WATCH_H
#define TENSORD_WATCH_H

#include <stdbool.h>
#include <stddef.h>

#include "daemon/registry/registry.h"

/*
 * Events a watcher queues when the Watch asked for no size; the default of
 * --max-watch-queue, the most a Watch gets (asking more gets that); and
 * the most that option may say. Queued events take their name's length
 * (watch_event), charged to the uid's share (--max-watch-bytes-per-uid).
 */
#define WATCH_QUEUE_DEFAULT 1024u
#define WATCH_QUEUE_MAX_DEFAULT 4096u
#define WATCH_QUEUE_MAX 65536u
/* A full queue looks for an event of the same name among its newest this many. */
#define WATCH_COALESCE_SCAN 64u
/* Events in one Events reply at most. */
#define WATCH_BATCH 256
/* A watcher sends while its connection has fewer reply bytes than this unread. */
#define WATCH_OUT_LIMIT (1u << 20)

struct client;
struct server;

/* A commit step's changes (registry.on_commit, through dispatch): queued and sent. */
void watch_on_commit(struct server *srv, const struct reg_change *v, size_t n, bool lost);

/* cl's connection sent what it had queued: its watchers send what they held back. */
void watch_drained(struct client *cl);

/* cl's connection closed: its watchers go. */
void watch_client_gone(struct client *cl);

#endif
