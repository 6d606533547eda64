/*
 * Leases going out: the lease reply and the descriptor made when it is
 * sent, attach at once or parked as a waiter until a publish (each
 * connection's and uid's waiters bounded), and the waiter's answer.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dispatch_int.h"
#include "figures.h"
#include "common/vendor.h"
#include "daemon/base/log.h"
#include "metrics.h"
#include "reply.h"
#include "server.h"

/* Whether the client said it holds the descriptor of share id (a slab). */
static bool holds_share(uint64_t id, const uint64_t *have, size_t n)
{
	for (size_t i = 0; id && i < n; i++)
		if (have[i] == id)
			return true;
	return false;
}

/* Whether a lease on t comes with a descriptor to map: host memory, or as its GPU vendor says. */
bool dispatch_lease_has_fd(const struct tensor *t)
{
	return t->alloc.handle_kind == TENSORD__HANDLE_KIND__HANDLE_MEMFD ||
	       td_gpu_handle_fd(t->alloc.handle_kind);
}

/*
 * Replies with a lease on t. The descriptor, if one goes with it, is made
 * when the reply is sent (dispatch_export_fd), not now: a client that does
 * not read its replies holds no descriptors of ours.
 */
void dispatch_send_lease(struct client *cl, unsigned kind, uint64_t req_id, struct tensor *t,
			 uint64_t lease, bool writable, uint64_t have_id,
			 const uint64_t *have_shares, size_t n_have_shares, bool bind)
{
	/* The client already maps this very tensor, or holds the slab it is
	 * in: send no descriptor. */
	bool reused = have_id && have_id == t->id;
	struct conn_fd_ticket tk = {
		.req_id = req_id, .kind = kind, .lease = lease, .writable = writable
	};
	bool with_fd = !reused && dispatch_lease_has_fd(t) &&
		       !holds_share(t->alloc.share_id, have_shares, n_have_shares);
	uint32_t slot = 0;
	uint64_t gen = 0;

	/* Host memory and CUDA VMM (issue 32: the client keeps its one import
	 * of the allocation while bound). Not legacy IPC, whose leases the
	 * daemon must see end (quarantine.c). */
	if (bind &&
	    (t->alloc.handle_kind == TENSORD__HANDLE_KIND__HANDLE_MEMFD ||
	     t->alloc.handle_kind == TENSORD__HANDLE_KIND__HANDLE_CUDA_VMM_FD) &&
	    !registry_bind(&cl->rc, lease, &slot, &gen))
		slot = 0;
	reply_lease(cl->conn, req_id, t, lease, writable, reused, 0, slot, gen,
		    with_fd ? &tk : NULL);
}

void dispatch_do_bind_page(struct client *cl, uint64_t id)
{
	struct conn_fd_ticket tk = { .req_id = id,
				     .kind = TENSORD__REQUEST__BODY_BIND_PAGE,
				     .page = true };
	uint32_t words;
	char why[300];
	int fd, r;

	r = registry_bind_page(&cl->rc, &fd, &words, why, sizeof(why));
	if (r < 0) {
		reply_status(cl->conn, TENSORD__REQUEST__BODY_BIND_PAGE, id, r, why);
		return;
	}
	/* Its descriptor is duplicated when the reply goes (dispatch_export_fd). */
	reply_bind_page(cl->conn, id, words, &tk);
}

/* Leases one Readopt may name: its reply stays well inside a frame. */
#define READOPT_MAX 4096

void dispatch_do_readopt(struct client *cl, uint64_t id, const Tensord__Readopt *m)
{
	Tensord__Reply rep = TENSORD__REPLY__INIT;
	Tensord__ReadoptReply rr = TENSORD__READOPT_REPLY__INIT;
	uint64_t *leases;
	size_t n = m->n_leases, got = 0;
	char why[160];

	if (n > READOPT_MAX) {
		snprintf(why, sizeof(why), "a Readopt of %zu leases: at most %d in one request", n,
			 READOPT_MAX);
		reply_status(cl->conn, TENSORD__REQUEST__BODY_READOPT, id, -EINVAL, why);
		return;
	}
	leases = calloc(n ? n : 1, sizeof(*leases));
	if (!leases) {
		reply_status(cl->conn, TENSORD__REQUEST__BODY_READOPT, id, -ENOMEM,
			     "out of memory to re-adopt leases");
		return;
	}
	for (size_t i = 0; i < n; i++) {
		const Tensord__ReadoptLease *w = m->leases[i];

		if (w && registry_readopt(&cl->srv->reg, &cl->rc, w->name, w->generation,
					  &leases[i]) == 0)
			got++;
	}
	if (n)
		log_debug("conn %llu: pid %u re-adopted %zu of the %zu leases it held before the "
			  "restart",
			  (unsigned long long)cl->conn->id, cl->rc.pid, got, n);
	rr.n_lease = n;
	rr.lease = leases;
	rep.id = id;
	rep.body_case = TENSORD__REPLY__BODY_READOPT;
	rep.readopt = &rr;
	reply_send(cl->conn, &rep, NULL);
	free(leases);
}

int dispatch_export_fd(struct conn *c, const struct conn_fd_ticket *tk, void *ctx)
{
	struct client *cl = conn_data(c);
	struct tensor *t;
	int fd = -1, r;

	if (tk->page) {
		uint32_t words;
		char why[300];

		/* The page lives as long as its connection: it is there. */
		r = registry_bind_page(&cl->rc, &fd, &words, why, sizeof(why));
		if (r < 0)
			return r;
		fd = fcntl(fd, F_DUPFD_CLOEXEC, 3);
		return fd < 0 ? -errno : fd;
	}
	if (tk->reserve) {
		/* A client may name a reserve in a Create before its reply went. */
		struct reg_reserve *rs = registry_reserve_find(&cl->rc, tk->reserve);

		if (!rs)
			return -ESRCH;
		r = rs->alloc.ops->export_fd(&rs->alloc, true, &fd);
		if (r == 0 && fd < 0)
			r = -EPROTO;
		return r < 0 ? r : fd;
	}
	t = registry_lease_tensor(&cl->rc, tk->lease);
	/* A client may release a lease before it read the reply that names it. */
	if (!t)
		return -ESRCH;
	r = t->alloc.ops->export_fd(&t->alloc, tk->writable, &fd);
	if (r == 0 && fd < 0)
		r = -EPROTO;
	return r < 0 ? r : fd;
}

void dispatch_export_failed(struct conn *c, const struct conn_fd_ticket *tks, size_t n,
			    size_t failed, int err, void *ctx)
{
	struct client *cl = conn_data(c);
	const struct conn_fd_ticket *tk = &tks[failed];
	struct tensor *t = registry_lease_tensor(&cl->rc, tk->lease);
	char why[400];

	if (tk->page) {
		reply_status(c, tk->kind, tk->req_id, err,
			     "binding page: duplicating its descriptor failed");
		return;
	}
	if (tk->reserve) {
		/* Its client never learns of it: it goes. */
		snprintf(why, sizeof(why), "reserve %llu: %s", (unsigned long long)tk->reserve,
			 err == -ESRCH ? "gone before its reply was sent"
				       : "exporting its memory failed");
		registry_unreserve(&cl->srv->reg, &cl->rc, tk->reserve);
		reply_status(c, tk->kind, tk->req_id, err, why);
		return;
	}
	if (t)
		snprintf(why, sizeof(why), "tensor '%s': exporting its memory failed: %s", t->name,
			 strerror(-err));
	else
		snprintf(why, sizeof(why), "lease %llx was released before its reply was sent",
			 (unsigned long long)tk->lease);
	/* Every lease the frame names goes: its client never learns of them.
	 * For a set, the client drops the parts it had, releasing theirs. */
	for (size_t i = 0; i < n; i++)
		registry_release(&cl->srv->reg, &cl->rc, tks[i].lease);
	reply_status(c, tk->kind, tk->req_id, err, why);
}

/* name: already checked. */
static void attach_now(struct client *cl, uint64_t id, const char *name, size_t len,
		       uint64_t have_id, const uint64_t *have_shares, size_t n_have_shares,
		       bool bind)
{
	char why[400];
	struct tensor *t;
	uint64_t lease;
	bool writable;
	int r;

	r = registry_attach(&cl->srv->reg, &cl->rc, name, len, &t, &lease, &writable, why,
			    sizeof(why));
	if (r < 0) {
		reply_status(cl->conn, TENSORD__REQUEST__BODY_ATTACH, id, r, why);
		return;
	}
	log_debug("tensor '%s': attached by pid %u, lease %llx%s", t->name, cl->rc.pid,
		  (unsigned long long)lease, writable ? ", writable" : "");
	dispatch_send_lease(cl, TENSORD__REQUEST__BODY_ATTACH, id, t, lease, writable, have_id,
			    have_shares, n_have_shares, bind);
	metrics_attach_served();
}

void dispatch_attach_local(struct client *cl, uint64_t id, const char *name, size_t len,
			   uint64_t have_id, const uint64_t *have_shares, size_t n_have_shares,
			   bool bind)
{
	attach_now(cl, id, name, len, have_id, have_shares, n_have_shares, bind);
}

int dispatch_waiter_charge(struct client *cl, unsigned kind, uint64_t id, const char *what)
{
	struct server *srv = cl->srv;
	char why[500], reason[200];
	int r;

	if (cl->waits.n_waiters >= srv->quota.lim.waiters_per_conn) {
		snprintf(why, sizeof(why),
			 "%s: %u attaches already waiting on this connection, the "
			 "most one may have (--max-waiters-per-conn)",
			 what, cl->waits.n_waiters);
		reply_status(cl->conn, kind, id, -EAGAIN, why);
		return -EAGAIN;
	}
	r = quota_charge(&srv->quota, cl->rc.uid, QUOTA_WAITERS, 1, reason, sizeof(reason));
	if (r < 0) {
		snprintf(why, sizeof(why), "%s: %s", what, reason);
		reply_status(cl->conn, kind, id, r, why);
	}
	return r;
}

void dispatch_do_attach(struct client *cl, uint64_t id, const Tensord__Attach *m)
{
	struct server *srv = cl->srv;
	struct waiter_req req = { .req_id = id, .have_id = m->have_id, .bind = m->bind };
	char why[400], what[300];
	int r;

	r = dispatch_check_name(m->name, why, sizeof(why));
	if (r < 0) {
		reply_status(cl->conn, TENSORD__REQUEST__BODY_ATTACH, id, r, why);
		return;
	}
	req.name_len = strlen(m->name);
	req.after = m->after;
	if (registry_generation(&srv->reg, m->name, req.name_len) > m->after) {
		attach_now(cl, id, m->name, req.name_len, m->have_id, m->have_shares,
			   m->n_have_shares, m->bind);
		return;
	}
	if (m->timeout_ms == 0 && m->after &&
	    registry_published(&srv->reg, m->name, req.name_len)) {
		snprintf(why, sizeof(why), "tensor '%s': no generation newer than %llu yet",
			 m->name, (unsigned long long)m->after);
		reply_status(cl->conn, TENSORD__REQUEST__BODY_ATTACH, id, -ETIMEDOUT, why);
		return;
	}
	if (m->timeout_ms == 0) {
		attach_now(cl, id, m->name, req.name_len, m->have_id, m->have_shares,
			   m->n_have_shares, m->bind);
		return;
	}
	snprintf(what, sizeof(what), "tensor '%s'", m->name);
	r = dispatch_waiter_charge(cl, TENSORD__REQUEST__BODY_ATTACH, id, what);
	if (r < 0)
		return;
	memcpy(req.name, m->name, req.name_len + 1);
	if (waiters_add(&srv->waiters, &cl->waits, &req, m->timeout_ms) < 0) {
		quota_uncharge(&srv->quota, cl->rc.uid, QUOTA_WAITERS, 1);
		reply_status(cl->conn, TENSORD__REQUEST__BODY_ATTACH, id, -ENOMEM,
			     "out of memory for a waiter");
		return;
	}
	figure_count(FIG_attach_waits_total, 1);
	log_debug("conn %llu: waiting for '%s' (%lld ms)", (unsigned long long)cl->conn->id,
		  req.name, (long long)m->timeout_ms);
}

void dispatch_waiter_done(struct waiter_owner *o, const struct waiter_req *req, int status,
			  void *ctx)
{
	struct client *cl = o->data;
	char why[400];

	metrics_attach_woken();
	quota_uncharge(&cl->srv->quota, cl->rc.uid, QUOTA_WAITERS, 1);
	if (req->set) {
		dispatch_set_done(cl, req, status);
		return;
	}
	if (status == 0) {
		/* A waiter keeps no share list: the slab's descriptor comes again. */
		attach_now(cl, req->req_id, req->name, req->name_len, req->have_id, NULL, 0,
			   req->bind);
		return;
	}
	if (status == -ECANCELED)
		snprintf(why, sizeof(why), "tensor '%s': the wait was cancelled", req->name);
	else if (req->after)
		snprintf(why, sizeof(why),
			 "tensor '%s': no generation newer than %llu within the "
			 "timeout",
			 req->name, (unsigned long long)req->after);
	else
		snprintf(why, sizeof(why), "tensor '%s': not published within the timeout",
			 req->name);
	reply_status(cl->conn, TENSORD__REQUEST__BODY_ATTACH, req->req_id, status, why);
}