/*
 * The protocol layer: request frames in, registry and waiter calls, replies
 * out. It calls conn.c, reply.c, waiters.c, the registry and, for "@"
 * names, remote attach by name; those reach it only through the callbacks
 * below, which server.c wires into struct conn_handlers, struct waiters,
 * the registry's on_commit and struct remote_hooks.
 */
#ifndef TENSORD_DISPATCH_H
#define TENSORD_DISPATCH_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/queue.h>

#include "conn.h"
#include "proto/tensord.pb-c.h"
#include "daemon/registry/registry.h"
#include "waiters.h"

/* Names in one List reply at most: about 1 MiB with the longest names. */
#define DISPATCH_LIST_PAGE 1024
/*
 * GPU creates of one connection whose memory the GPU worker is allocating
 * at once; past it, EAGAIN. Bounds the worker's queue that one client can
 * fill (the GPU worker serves every client in turn).
 */
#define DISPATCH_CREATES_IN_FLIGHT 16
/* Members of one AttachMany at most, and leases per frame of its reply. */
#define DISPATCH_SET_MAX 65536u
#define DISPATCH_SET_PART 240u

struct pending_create;
struct watcher;

/* One client as the protocol sees it: the conn_data() of its connection. */
struct client {
	struct server *srv;                  /* borrowed */
	struct conn *conn;                   /* borrowed: the connection this lives in */
	struct reg_client rc;                /* who it is, and its leases */
	struct waiter_owner waits;           /* its parked attaches */
	LIST_HEAD(, pending_create) pending; /* its creates the GPU worker is allocating */
	unsigned n_pending;
	LIST_HEAD(, watcher) watches; /* its watchers (watch.c), owned */
	bool hello_done;
	uint64_t token; /* Hello.token, counted open in srv->seqs; 0: none */
	/* For inspection (inspect.c): */
	uint64_t connected_ns;             /* CLOCK_MONOTONIC at accept */
	uint64_t requests;                 /* requests decoded */
	char comm[16];                     /* /proc/PID/comm at accept; "" if unknown */
	char hello[32];                    /* what it said in Hello, printable ASCII */
	char label[TENSORD_LABEL_MAX + 1]; /* Hello.name, checked; "" if none */
};

/* conn_handlers: ctx is the struct server. */
void dispatch_open(struct conn *c, void *ctx);
/* Handles one request frame. payload is borrowed: valid during the call. */
void dispatch_frame(struct conn *c, const uint8_t *payload, size_t len, void *ctx);
/* Answers a framing error; conn.c closes after. */
void dispatch_protocol_error(struct conn *c, int status, const char *msg, void *ctx);
/* Drops the client's waiters, then its leases and the tensors that go with it. */
void dispatch_close(struct conn *c, void *ctx);

/* conn_handlers.export_fd: the descriptor of a lease reply, made as it is sent.
 */
int dispatch_export_fd(struct conn *c, const struct conn_fd_ticket *tk, void *ctx);
/* conn_handlers.export_failed: ends the leases of the frame and answers with err. */
void dispatch_export_failed(struct conn *c, const struct conn_fd_ticket *tks, size_t n,
			    size_t failed, int err, void *ctx);

/* conn_handlers.on_drained: watches send what they held back. */
void dispatch_drained(struct conn *c, void *ctx);

/*
 * registry.on_commit (ctx: the struct server): wakes the waiters of the
 * names published, the set waiters the changes touch, and tells watches.
 */
void dispatch_on_commit(void *ctx, const struct reg_change *v, size_t n, bool lost);
/* registry.on_retired_gone: a retired version's end, logged (state_on_retired_gone()). */
void dispatch_on_retired_gone(void *ctx, const struct tensor *t);

/* waiter_ready_fn: whether a touched set waiter's set is ready (dispatch_set.c). */
bool dispatch_set_ready(struct waiter_owner *o, const struct waiter_req *req, void *ctx);

/*
 * struct remote_hooks (remote.h): how remote attach answers clients.
 * dispatch.c routes requests of "@" names down to remote attach; these
 * are its only ways back up.
 */
/* A status reply to request id (of kind) of cl. */
void dispatch_remote_status(struct client *cl, unsigned kind, uint64_t id, int status,
			    const char *why);
/* A reply of cl's that carries no descriptor (a List of a peer's names). */
void dispatch_remote_reply(struct client *cl, const Tensord__Reply *rep);

/* An attach of a published local name now (remote.c's replicas), answered either way. */
void dispatch_attach_local(struct client *cl, uint64_t id, const char *name, size_t len,
			   uint64_t have_id, const uint64_t *have_shares, size_t n_have_shares,
			   bool bind);

/*
 * The members of the set m names (its names or prefix; its after and
 * timeout ignored) as rc may read them now, resolved as an AttachMany
 * resolves them: *ret_v (n of them, in name order; the caller frees the
 * array, the tensors borrowed until the loop runs again) and the newest
 * commit among them. -ENOENT for a listed name not published, -EACCES
 * for one rc may not read, -EINVAL, -E2BIG, -ENOMEM: with the reason.
 */
int dispatch_set_members(struct registry *reg, struct reg_client *rc, const Tensord__AttachMany *m,
			 struct tensor ***ret_v, size_t *ret_n, uint64_t *ret_commit, char *why,
			 size_t why_len);

/*
 * Answers AttachMany request id of cl now with the published tensors
 * names[n] (remote.c's replicas of a set, just published in one commit),
 * as a local AttachMany of that list is answered; have_shares as its.
 */
void dispatch_set_answer(struct client *cl, uint64_t id, const char *const *names, size_t n,
			 const uint64_t *have_shares, size_t n_have_shares);

/* waiter_done_fn: answers a parked attach, with a lease or -ETIMEDOUT. */
void dispatch_waiter_done(struct waiter_owner *o, const struct waiter_req *req, int status,
			  void *ctx);

#endif
