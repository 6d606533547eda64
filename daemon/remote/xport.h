/*
 * The data path between daemons (docs/remote.md, "Remote attach: the data
 * flow"): one message of a tensor's bytes from the exporting daemon to the
 * pulling one, tagged with the puller's pull id. Built on UCX active
 * messages (daemon/remote/xport/ucx.c) where UCX is found, else on nothing
 * (daemon/remote/xport/none.c, whose init says why): the Makefile links one.
 *
 * Everything runs on the loop thread. The transport's callbacks are never
 * called from inside a UCX progress call: what completes there is queued
 * and delivered after it returns, so they may call anything.
 *
 * Never UCP_FEATURE_RMA: over TCP UCX's software RMA reads and writes
 * whatever address a request names (docs/remote.md, fact 2).
 */
#ifndef TENSORD_XPORT_H
#define TENSORD_XPORT_H

#include <stddef.h>
#include <stdint.h>

#include <uv.h>

struct xport;
struct xport_ep;

struct xport_cbs {
	/*
	 * A message of len bytes tagged tag arrived (called inside progress:
	 * it must only look up): where to put it, len bytes the caller keeps
	 * valid until recv_done, or NULL to drop it.
	 */
	void *(*recv_dest)(void *ctx, uint64_t tag, size_t len);
	/* The message tagged tag is in place (0) or lost (-errno). */
	void (*recv_done)(void *ctx, uint64_t tag, int status);
	/* xport_send()'s send of arg ended: 0, or -errno. */
	void (*send_done)(void *ctx, void *arg, int status);
	/* An endpoint's peer failed (ep_ctx: xport_connect()'s); sends on it end with an error. */
	void (*ep_failed)(void *ctx, void *ep_ctx, int status);
	void *ctx;
};

/* 0, or -errno with the reason in why (UCX missing, or failing to start). */
int xport_init(struct xport **ret, uv_loop_t *loop, const struct xport_cbs *cbs, char *why,
	       size_t why_len);

/* This worker's address, for the control channel. Borrowed until xport_fini(). */
void xport_address(const struct xport *x, const void **ret_addr, size_t *ret_len);

/* What the transport is, for the log ("UCX 1.13.1, active messages"). */
const char *xport_describe(const struct xport *x);

/* An endpoint to the worker at addr (a peer's xport_address()). 0, or -errno with why. */
int xport_connect(struct xport *x, const void *addr, size_t len, void *ep_ctx,
		  struct xport_ep **ret, char *why, size_t why_len);

/*
 * Closes ep: nothing more is said about it (ep_failed). With sends in
 * flight it closes once they end, within 10 s (then they end with an
 * error, send_done); without, at once. NULL-safe.
 */
void xport_ep_close(struct xport_ep *ep);

/*
 * Sends len bytes at buf, tagged tag, on ep; buf stays valid until
 * send_done(arg). 0 (send_done follows, always), or -errno (it will not).
 */
int xport_send(struct xport_ep *ep, uint64_t tag, const void *buf, size_t len, void *arg);

/* Bytes sent and received, for the figures. */
void xport_counts(const struct xport *x, uint64_t *ret_sent, uint64_t *ret_received);

/* Closes every endpoint, the worker and the context; x is freed once its handles close. */
void xport_fini(struct xport *x);

#endif /* TENSORD_XPORT_H */
