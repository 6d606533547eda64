/*
 * What the parts of request dispatch share, and nothing else includes:
 * dispatch.c (decoding, the plain requests, routing "@" names to remote
 * attach, connections), dispatch_create.c (create and put: device UUIDs,
 * the GPU creates the worker allocates), dispatch_lease.c (leases going
 * out: the lease reply and its descriptor, attach and its waiters),
 * dispatch_set.c (AttachMany: sets and their waiters) and watch.c
 * (Watch and Unwatch: events of names, queued per watch).
 */
#ifndef TENSORD_DISPATCH_INT_H
#define TENSORD_DISPATCH_INT_H

#include "dispatch.h"
#include "proto/tensord.pb-c.h"

/* The one check of a name from a peer. 0, or -EINVAL with the reason. */
int dispatch_check_name(const char *name, char *why, size_t why_len);

/*
 * Replies to request req_id (of kind, a Tensord__Request body case) with a
 * lease on t. The descriptor, if one goes with it, is made when the reply
 * is sent (dispatch_export_fd), not now: a client that does not read its
 * replies holds no descriptors of ours. have_id and have_shares: what the
 * client said it maps already (an attach's), so that no descriptor goes.
 * bind: the attach asked for a binding (registry_bind()), given where
 * it can be (host memory).
 */
void dispatch_send_lease(struct client *cl, unsigned kind, uint64_t req_id, struct tensor *t,
			 uint64_t lease, bool writable, uint64_t have_id,
			 const uint64_t *have_shares, size_t n_have_shares, bool bind);

/* BindPage: this connection's binding page and its descriptor. */
void dispatch_do_bind_page(struct client *cl, uint64_t id);
/* Readopt: leases of the previous daemon's restored tensors, taken again (registry_readopt()). */
void dispatch_do_readopt(struct client *cl, uint64_t id, const Tensord__Readopt *m);

/* Whether a lease on t comes with a descriptor to map (unless the client holds it). */
bool dispatch_lease_has_fd(const struct tensor *t);

/* Create, and the inline put (dispatch_create.c). m is borrowed for the call. */
void dispatch_do_create(struct client *cl, uint64_t id, const Tensord__Create *m);
void dispatch_do_put(struct client *cl, uint64_t id, const Tensord__Put *m);

/* Reserve and Unreserve (dispatch_create.c; docs/design.md, "The reserve"). m is borrowed. */
void dispatch_do_reserve(struct client *cl, uint64_t id, const Tensord__Reserve *m);
void dispatch_do_unreserve(struct client *cl, const Tensord__Unreserve *m);

/* cl's connection closed: its GPU creates in flight complete without it. */
void dispatch_create_forget(struct client *cl);

/* Attach, at once or parked as a waiter (dispatch_lease.c). m is borrowed. */
void dispatch_do_attach(struct client *cl, uint64_t id, const Tensord__Attach *m);

/*
 * One more waiter for cl, within --max-waiters-per-conn and its uid's
 * share: 0, or -errno and request id (of kind) answered, naming what.
 */
int dispatch_waiter_charge(struct client *cl, unsigned kind, uint64_t id, const char *what);

/* AttachMany (dispatch_set.c). m is borrowed. */
void dispatch_do_attach_many(struct client *cl, uint64_t id, const Tensord__AttachMany *m);

/* A parked AttachMany is done (status 0: its set is ready). req is borrowed. */
void dispatch_set_done(struct client *cl, const struct waiter_req *req, int status);

/* Watches (watch.c). */
void dispatch_do_watch(struct client *cl, uint64_t id, const Tensord__Watch *m);
void dispatch_do_unwatch(struct client *cl, uint64_t id, const Tensord__Unwatch *m);

/*
 * Idempotent writes (dispatch_resolve.c, docs/restart.md section 5).
 * dispatch_seqs_arm(): before a request, whether it is an effecting one
 * with a seq (then its first commit step is remembered as its result);
 * dispatch_seqs_step(): a commit step's changes, before they are logged.
 */
void dispatch_seqs_arm(struct client *cl, const Tensord__Request *req);
void dispatch_seqs_step(struct server *srv, const struct reg_change *v, size_t n);
void dispatch_do_resolve(struct client *cl, uint64_t id, const Tensord__Resolve *m);

#endif /* TENSORD_DISPATCH_INT_H */
