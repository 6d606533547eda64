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
#include "proto/tensord.pb-c.h"
#include "daemon/base/quota.h"
#include "daemon/registry/registry.h"

/*
 * A reply that carries only a status: 0 with an empty message for success,
 * or -errno with the one-line reason. kind is the request's (its
 * Tensord__Request body case; 0 for one that could not be decoded), which
 * the error is counted against.
 */
void reply_status(struct conn *c, unsigned kind, uint64_t req_id, int status, const char *msg);

/*
 * Sends rep (borrowed) and tk, the descriptor that goes with it (NULL:
 * none); a reply too large for a frame is answered with -EMSGSIZE instead.
 */
void reply_send(struct conn *c, const Tensord__Reply *rep, const struct conn_fd_ticket *tk);

/* As reply_send(), with the n descriptors tks[] name (one frame carries them all). */
void reply_send_fds(struct conn *c, const Tensord__Reply *rep, const struct conn_fd_ticket *tks,
		    size_t n);

/*
 * Called with every status reply_status() sends, and the kind of request it
 * answers; set by server.c (metrics_reply_status). NULL: nobody counts.
 */
extern void (*reply_on_status)(unsigned kind, int status);

/* Storage that a TensorInfo points into while it is packed. */
struct info_store {
	Tensord__TensorInfo info;
	Tensord__DType dtype;
	Tensord__Device device;
	uint8_t uuid[16];
};

/* Storage a Lease points into while it is packed. */
struct reply_lease_store {
	Tensord__Lease lease;
	struct info_store info;
};

/* Fills s with a lease on t (borrowed: s points into t until it is packed). */
void reply_fill_lease(struct reply_lease_store *s, const struct tensor *t, uint64_t lease,
		      bool writable, bool reused);

/*
 * A lease on t. tk (NULL when no descriptor goes with it: reused, the
 * client's reserve, or a handle kind that travels as bytes) names the
 * descriptor, made when the frame is sent (conn_handlers.export_fd).
 * reserve: nonzero when t's memory is the client's reserve of that id. t
 * is borrowed. bind_slot, bind_gen: the lease's binding (registry_bind()), 0 for none.
 */
void reply_lease(struct conn *c, uint64_t req_id, const struct tensor *t, uint64_t lease,
		 bool writable, bool reused, uint64_t reserve, uint32_t bind_slot,
		 uint64_t bind_gen, const struct conn_fd_ticket *tk);

/* What BindPage answers: the page's size in words; tk names its descriptor. */
void reply_bind_page(struct conn *c, uint64_t req_id, uint32_t words,
		     const struct conn_fd_ticket *tk);

/* What Reserve answers: the reserve's id and size; tk names its descriptor. */
void reply_reserve(struct conn *c, uint64_t req_id, uint64_t id, uint64_t size,
		   const struct conn_fd_ticket *tk);

/* What a publish (or a put that published) answers: t's generation and commit. */
void reply_published(struct conn *c, uint64_t req_id, const struct tensor *t);

/* What a commit answers. */
void reply_commit(struct conn *c, uint64_t req_id, uint64_t commit, uint32_t published,
		  uint32_t unlinked);

/* What stat answers. t is borrowed. */
void reply_info(struct conn *c, uint64_t req_id, const struct tensor *t);

/*
 * What list answers: one page of n tensors, borrowed, in that order; next:
 * the name to go on after when more remain (borrowed), else NULL. -ENOMEM
 * is answered here.
 */
void reply_list(struct conn *c, uint64_t req_id, struct tensor *const *v, size_t n,
		const char *next);

/*
 * What stats answers: the figures in set; with figures_only false also the
 * fields StatsReply had before figures, for older clients (reply_stats.c).
 */
struct figure_set;
void reply_stats(struct conn *c, uint64_t req_id, const struct figure_set *set, bool figures_only);

/*
 * Packs a reply carrying only status and msg, with request id 0, as a whole
 * frame into buf: its length, or 0 if it does not fit. For connections
 * refused before they are served (conn_handlers.pack_refusal).
 */
size_t reply_pack_refusal(uint8_t *buf, size_t cap, int status, const char *msg);

/* The answer to a hello of the right version. */
void reply_hello(struct conn *c, uint64_t req_id);

/*
 * The lineage every later Hello is answered with (HelloReply.lineage): the
 * restored state's, set once before serving (docs/restart.md); never
 * called: the daemon's instance.
 */
void reply_set_lineage(uint64_t lineage);

/* HelloReply.instance: random, nonzero, this daemon's for its life. */
uint64_t reply_instance(void);

#endif
