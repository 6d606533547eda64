/*
 * The daemon's event-loop side: the listening socket, one struct conn per
 * client, waiters for attach-with-timeout, and the request dispatcher.
 * Everything runs on the one libuv loop thread.
 */
#ifndef TENSORD_SERVER_H
#define TENSORD_SERVER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include <uv.h>

#include "registry.h"
#include "proto/tensord.pb-c.h"

/* Replies queued for one client before we stop reading its requests. */
#define CONN_OUT_HIGH (4u << 20)
/* Attaches one client may have waiting at once. */
#define CONN_WAITERS_MAX 256

struct server_config {
	char socket_path[108];
	uint64_t host_capacity;     /* 0: default */
	mode_t socket_mode;         /* default 0600 */
	gid_t socket_gid;           /* (gid_t)-1: leave as is */
	unsigned max_clients;
};

struct outbuf {
	struct outbuf *next;
	size_t len, off;
	int fd;                     /* owned; -1 when none; sent with the first byte */
	uint8_t data[];
};

struct conn {
	struct server *srv;
	uint64_t id;
	int fd;                     /* owned; closed once poll is closed */
	uv_poll_t poll;
	int poll_events;
	uint8_t *in;                /* received, not yet parsed */
	size_t in_len, in_cap;
	struct outbuf *out_head, *out_tail;
	size_t out_bytes;
	bool hello_done;
	bool closing;               /* flush what is queued, then close */
	bool dead;                  /* closed; waiting for libuv to let go */
	unsigned n_waiters;
	struct reg_client rc;
	struct conn *prev, *next;
};

struct waiter {
	struct conn *conn;          /* borrowed; NULL once the conn is gone */
	uint64_t req_id;
	uint64_t have_id;
	char name[TENSORD_NAME_MAX + 1];
	size_t name_len;
	bool has_timer;
	uv_timer_t timer;
	struct waiter *prev, *next;
};

struct server {
	uv_loop_t *loop;
	struct server_config cfg;
	struct registry reg;
	int listen_fd;
	int reserve_fd;             /* spare descriptor for shedding clients at EMFILE */
	uv_poll_t listen_poll;
	uv_signal_t sigterm, sigint;
	struct conn *conns;
	unsigned n_conns;
	uint64_t next_conn_id;
	struct waiter *waiters;
	uint64_t start_ns;
	bool stopping;
};

/* listen.c */
int server_listen(struct server *srv);
void server_stop(struct server *srv);

/* conn.c */
void conn_accept(struct server *srv, int fd);
/* Queues a reply; takes ownership of fd (-1 when none). */
int conn_reply(struct conn *c, const Tensord__Reply *reply, int fd);
/* Replies with an error status and message. */
void conn_reply_error(struct conn *c, uint64_t req_id, int status, const char *msg);
/* Flushes what is queued, then closes. */
void conn_shutdown(struct conn *c);
/* Closes at once: drops its leases, waiters and queued replies. */
void conn_close(struct conn *c);

/* dispatch.c */
/* Handles one request frame's payload. */
void dispatch_frame(struct conn *c, const uint8_t *payload, size_t len);
/* Completes waiters for a tensor that was just published. */
void dispatch_on_publish(void *ctx, struct tensor *t);
void waiters_drop_conn(struct server *srv, struct conn *c);
void waiters_drop_all(struct server *srv);

uint64_t now_ns(void);

#endif
