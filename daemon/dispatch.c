/*
 * Request dispatch: protobuf-c unpack -> checks -> registry or waiter call
 * -> reply. This is the decoding boundary: every name a peer sends (create,
 * publish, attach, unlink, stat, the list prefix) is checked here, once,
 * before the registry or the waiters see it; they assume valid names.
 * Creates and puts are in dispatch_create.c, what sends leases (attach,
 * the lease reply and its descriptor) in dispatch_lease.c. Requests of
 * another node's names ("@PEER/..." attaches, sets and lists) are routed
 * here, down to remote attach (remote.h), which answers through the
 * dispatch_remote_* hooks and the others struct remote_hooks names.
 */
#include "dispatch.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/desc.h"
#include "dispatch_int.h"
#include "figures.h"
#include "inspect.h"
#include "daemon/base/log.h"
#include "metrics.h"
#include "prometheus.h"
#include "proto/tensord.pb-c.h"
#include "daemon/remote/remote.h"
#include "reply.h"
#include "server.h"
#include "watch.h"
#include "daemon/persist/seqs.h"

/*
 * Requests are unpacked into a bump arena that is reset after each one,
 * so the hot path does not call malloc. A request frame is at most 64 KiB;
 * its unpacked form is bounded by about 8x that (packed varints widening to
 * int64). A request that needs more is malformed anyway.
 */
static struct {
	size_t used;
	_Alignas(16) uint8_t buf[1u << 20];
} arena;

static void *arena_alloc(void *data, size_t size)
{
	size_t n = (size + 15) & ~(size_t)15;
	void *p;

	if (n < size || n > sizeof(arena.buf) - arena.used)
		return NULL;
	p = arena.buf + arena.used;
	arena.used += n;
	return p;
}

static void arena_free(void *data, void *p)
{
}

static ProtobufCAllocator arena_allocator = { arena_alloc, arena_free, NULL };

/* The one check of a name from a peer. 0, or -EINVAL with the reason. */
int dispatch_check_name(const char *name, char *why, size_t why_len)
{
	return td_name_check(name, strlen(name), why, why_len);
}

static void do_hello(struct client *cl, uint64_t id, const Tensord__Hello *m)
{
	struct conn *c = cl->conn;
	char why_label[160];

	if (m->version != TENSORD_PROTOCOL_VERSION) {
		char why[160];

		snprintf(why, sizeof(why),
			 "protocol version %u is not supported; tensord speaks %u", m->version,
			 TENSORD_PROTOCOL_VERSION);
		conn_log_limited(c, TD_LOG_WARN, LOG_KIND_BAD_FRAME,
				 "conn %llu: pid %u: %s, closing", (unsigned long long)c->id,
				 cl->rc.pid, why);
		reply_status(c, TENSORD__REQUEST__BODY_HELLO, id, -EPROTO, why);
		if (!conn_gone(c))
			conn_shutdown(c);
		return;
	}
	if (*m->name && td_label_check(m->name, why_label, sizeof(why_label)) < 0) {
		conn_log_limited(c, TD_LOG_WARN, LOG_KIND_BAD_FRAME,
				 "conn %llu: pid %u: hello: %s, closing", (unsigned long long)c->id,
				 cl->rc.pid, why_label);
		reply_status(c, TENSORD__REQUEST__BODY_HELLO, id, -EINVAL, why_label);
		if (!conn_gone(c))
			conn_shutdown(c);
		return;
	}
	if (m->token && cl->srv->seqs && !cl->token) {
		int r = seqs_open(cl->srv->seqs, m->token, cl->rc.uid);

		if (r < 0) {
			char why[160];

			snprintf(why, sizeof(why), "hello: token %016llx: %s",
				 (unsigned long long)m->token,
				 r == -EPERM ? "another user's requests use it" : strerror(-r));
			reply_status(c, TENSORD__REQUEST__BODY_HELLO, id, r, why);
			if (!conn_gone(c))
				conn_shutdown(c);
			return;
		}
		cl->token = m->token;
	}
	cl->hello_done = true;
	inspect_client_hello(cl, m->client, m->name);
	reply_hello(c, id);
}

static void do_publish(struct client *cl, uint64_t id, const Tensord__Publish *m)
{
	char why[400];
	int r;

	struct tensor *t;

	r = dispatch_check_name(m->name, why, sizeof(why));
	if (r == 0)
		r = registry_publish(&cl->srv->reg, &cl->rc, m->name, strlen(m->name), &t, why,
				     sizeof(why));
	if (r < 0)
		reply_status(cl->conn, TENSORD__REQUEST__BODY_PUBLISH, id, r, why);
	else
		reply_published(cl->conn, id, t);
}

static void do_release(struct client *cl, const Tensord__Release *m)
{
	/* One-way: deleters must never wait for the daemon. */
	if (m->forked && !m->lease) {
		unsigned n = registry_forked(&cl->srv->reg, &cl->rc);

		if (n)
			log_debug("conn %llu: pid %u forked holding leases: %u tensors' memory "
				  "will not be recycled",
				  (unsigned long long)cl->conn->id, cl->rc.pid, n);
		return;
	}
	if (registry_release(&cl->srv->reg, &cl->rc, m->lease) < 0)
		conn_log_limited(cl->conn, TD_LOG_WARN, LOG_KIND_BAD_RELEASE,
				 "conn %llu: pid %u released unknown lease %llx, ignoring",
				 (unsigned long long)cl->conn->id, cl->rc.pid,
				 (unsigned long long)m->lease);
}

static void do_unlink(struct client *cl, uint64_t id, const Tensord__Unlink *m)
{
	char why[400];
	int r;

	r = dispatch_check_name(m->name, why, sizeof(why));
	if (r == 0 && m->tx)
		r = registry_tx_unlink(&cl->srv->reg, &cl->rc, m->tx, m->name, strlen(m->name), why,
				       sizeof(why));
	else if (r == 0)
		r = registry_unlink(&cl->srv->reg, &cl->rc, m->name, strlen(m->name), why,
				    sizeof(why));
	reply_status(cl->conn, TENSORD__REQUEST__BODY_UNLINK, id, r, r < 0 ? why : "");
}

static void do_commit(struct client *cl, uint64_t id, const Tensord__Commit *m)
{
	uint32_t published = 0, unlinked = 0;
	uint64_t commit = 0;
	char why[600];
	int r;

	r = registry_tx_commit(&cl->srv->reg, &cl->rc, m->tx, &commit, &published, &unlinked, why,
			       sizeof(why));
	if (r < 0)
		reply_status(cl->conn, TENSORD__REQUEST__BODY_COMMIT, id, r, why);
	else
		reply_commit(cl->conn, id, commit, published, unlinked);
}

static void do_abort(struct client *cl, uint64_t id, const Tensord__Abort *m)
{
	char why[200];
	int r = registry_tx_abort(&cl->srv->reg, &cl->rc, m->tx, why, sizeof(why));

	reply_status(cl->conn, TENSORD__REQUEST__BODY_ABORT, id, r, r < 0 ? why : "");
}

static void do_stat(struct client *cl, uint64_t id, const Tensord__Stat *m)
{
	char why[400];
	struct tensor *t;
	int r;

	r = dispatch_check_name(m->name, why, sizeof(why));
	if (r < 0) {
		reply_status(cl->conn, TENSORD__REQUEST__BODY_STAT, id, r, why);
		return;
	}
	t = registry_lookup(&cl->srv->reg, &cl->rc, m->name, strlen(m->name));
	if (!t) {
		snprintf(why, sizeof(why), "tensor '%s': no such tensor", m->name);
		reply_status(cl->conn, TENSORD__REQUEST__BODY_STAT, id, -ENOENT, why);
		return;
	}
	reply_info(cl->conn, id, t);
}

/* A wait of this connection's ends, local or remote: answered ECANCELED. */
static void do_cancel(struct client *cl, uint64_t id, const Tensord__Cancel *m)
{
	int r = waiters_cancel(&cl->srv->waiters, &cl->waits, m->id);
	char why[120];

	if (r < 0)
		r = remote_cancel(&cl->srv->remote, cl, m->id);

	snprintf(why, sizeof(why), "request %llu: no wait of this connection to cancel",
		 (unsigned long long)m->id);
	reply_status(cl->conn, TENSORD__REQUEST__BODY_CANCEL, id, r, r < 0 ? why : "");
}

void dispatch_remote_status(struct client *cl, unsigned kind, uint64_t id, int status,
			    const char *why)
{
	reply_status(cl->conn, kind, id, status, why);
}

void dispatch_remote_reply(struct client *cl, const Tensord__Reply *rep)
{
	reply_send(cl->conn, rep, NULL);
}

static void do_list(struct client *cl, uint64_t id, const Tensord__List *m)
{
	struct tensor *v[DISPATCH_LIST_PAGE];
	size_t len = strlen(m->prefix), n = 0;
	size_t limit = m->limit && m->limit < DISPATCH_LIST_PAGE ? m->limit : DISPATCH_LIST_PAGE;
	const char *next = NULL;
	char why[8];

	/* "@PEER/PREFIX": what the peer exports to this node, asked of it. */
	if (m->prefix[0] == '@' && remote_list(&cl->srv->remote, cl, id, m))
		return;
	/* A prefix is checked like a name, except that it may be empty, or
	 * begin with '@' (this node's replicas of other nodes' tensors,
	 * "@PEER/NAME": docs/remote.md). One that no name can start with (too
	 * long, a byte names never have) matches nothing: the answer is the
	 * empty list, as tensord_list() documents, without walking the
	 * registry. */
	if (len &&
	    td_name_check(m->prefix + (m->prefix[0] == '@'), len - (m->prefix[0] == '@'), why,
			  sizeof(why)) < 0 &&
	    strcmp(m->prefix, "@") != 0) {
		reply_list(cl->conn, id, NULL, 0, NULL);
		return;
	}
	/* A page, never the whole registry: the reply stays far below the
	 * frame limit, and a client that asks and never reads holds a few. */
	registry_list(&cl->srv->reg, &cl->rc, m->prefix, len, m->after, limit, v, &n, &next);
	reply_list(cl->conn, id, v, n, next);
}

static void do_stats(struct client *cl, uint64_t id, const Tensord__Stats *m)
{
	struct figure_set set;

	figures_collect(cl->srv, cl->rc.uid, &set);
	reply_stats(cl->conn, id, &set, m->figures_only);
	figures_release(&set);
}

/*
 * What a draining daemon (server_drain()) still does: requests that change
 * no state that the log or the store keeps. Listed, not excluded, so that a
 * request kind added later is refused while draining until someone decides
 * it is a read. A local attach may bind or wait (a waiter sees no commit
 * here: its client waits again on the next daemon); a release frees memory
 * that keeps its bytes; '@' attaches are left to the next daemon, whose
 * replica they make.
 */
static bool served_while_draining(const Tensord__Request *req)
{
	switch (req->body_case) {
	case TENSORD__REQUEST__BODY_HELLO:
	case TENSORD__REQUEST__BODY_RELEASE:
	case TENSORD__REQUEST__BODY_STAT:
	case TENSORD__REQUEST__BODY_LIST:
	case TENSORD__REQUEST__BODY_STATS:
	case TENSORD__REQUEST__BODY_CANCEL:
	case TENSORD__REQUEST__BODY_WATCH:
	case TENSORD__REQUEST__BODY_UNWATCH:
	case TENSORD__REQUEST__BODY_LEASE_LIST:
	case TENSORD__REQUEST__BODY_CLIENT_LIST:
	case TENSORD__REQUEST__BODY_METRICS:
	case TENSORD__REQUEST__BODY_BIND_PAGE:
	case TENSORD__REQUEST__BODY_PEER_LIST:
	case TENSORD__REQUEST__BODY_READOPT:
	case TENSORD__REQUEST__BODY_RESOLVE:
		return true;
	case TENSORD__REQUEST__BODY_ATTACH:
		return req->attach->name[0] != '@';
	case TENSORD__REQUEST__BODY_ATTACH_MANY:
		return !remote_set_is_remote(req->attach_many);
	default:
		return false;
	}
}

static void dispatch_request(struct client *cl, const Tensord__Request *req)
{
	struct conn *c = cl->conn;

	if (!cl->hello_done && req->body_case != TENSORD__REQUEST__BODY_HELLO) {
		conn_log_limited(c, TD_LOG_WARN, LOG_KIND_BEFORE_HELLO,
				 "conn %llu: pid %u: request before hello, closing",
				 (unsigned long long)c->id, cl->rc.pid);
		reply_status(c, (unsigned)req->body_case, req->id, -EPROTO,
			     "the first request must be hello");
		if (!conn_gone(c))
			conn_shutdown(c);
		return;
	}
	/* Not done, not answered: the client takes the close for a lost
	 * connection, reconnects (its connect waits in the backlog for the next
	 * daemon), asks that one whether the write took effect (Resolve: this
	 * instance recorded nothing more) and does it there. */
	if (cl->srv->draining && !served_while_draining(req)) {
		log_info(
			"conn %llu: pid %u: request %u while draining: closing the connection, the "
			"next daemon serves it",
			(unsigned long long)c->id, cl->rc.pid, (unsigned)req->body_case);
		conn_shutdown(c); /* the replies to reads before it go first */
		return;
	}
	dispatch_seqs_arm(cl, req);
	switch (req->body_case) {
	case TENSORD__REQUEST__BODY_HELLO:
		do_hello(cl, req->id, req->hello);
		break;
	case TENSORD__REQUEST__BODY_CREATE:
		dispatch_do_create(cl, req->id, req->create);
		break;
	case TENSORD__REQUEST__BODY_PUBLISH:
		do_publish(cl, req->id, req->publish);
		break;
	case TENSORD__REQUEST__BODY_ATTACH:
		if (req->attach->name[0] ==
		    '@') /* another node's tensor (docs/remote.md, "Naming") */
			remote_attach(&cl->srv->remote, cl, req->id, req->attach->name,
				      req->attach->have_id, req->attach->have_shares,
				      req->attach->n_have_shares, req->attach->bind,
				      req->attach->timeout_ms, req->attach->after);
		else
			dispatch_do_attach(cl, req->id, req->attach);
		break;
	case TENSORD__REQUEST__BODY_RELEASE:
		do_release(cl, req->release);
		break;
	case TENSORD__REQUEST__BODY_UNLINK:
		do_unlink(cl, req->id, req->unlink);
		break;
	case TENSORD__REQUEST__BODY_STAT:
		do_stat(cl, req->id, req->stat);
		break;
	case TENSORD__REQUEST__BODY_LIST:
		do_list(cl, req->id, req->list);
		break;
	case TENSORD__REQUEST__BODY_STATS:
		do_stats(cl, req->id, req->stats);
		break;
	case TENSORD__REQUEST__BODY_PUT:
		dispatch_do_put(cl, req->id, req->put);
		break;
	case TENSORD__REQUEST__BODY_COMMIT:
		do_commit(cl, req->id, req->commit);
		break;
	case TENSORD__REQUEST__BODY_ABORT:
		do_abort(cl, req->id, req->abort);
		break;
	case TENSORD__REQUEST__BODY_ATTACH_MANY:
		if (remote_set_is_remote(req->attach_many)) /* another node's set ("Sets") */
			remote_attach_many(&cl->srv->remote, cl, req->id, req->attach_many);
		else
			dispatch_do_attach_many(cl, req->id, req->attach_many);
		break;
	case TENSORD__REQUEST__BODY_CANCEL:
		do_cancel(cl, req->id, req->cancel);
		break;
	case TENSORD__REQUEST__BODY_WATCH:
		dispatch_do_watch(cl, req->id, req->watch);
		break;
	case TENSORD__REQUEST__BODY_UNWATCH:
		dispatch_do_unwatch(cl, req->id, req->unwatch);
		break;
	case TENSORD__REQUEST__BODY_LEASE_LIST:
		inspect_leases(cl, req->id, req->lease_list);
		break;
	case TENSORD__REQUEST__BODY_CLIENT_LIST:
		inspect_clients(cl, req->id, req->client_list);
		break;
	case TENSORD__REQUEST__BODY_METRICS:
		prometheus_reply(c, req->id, cl->srv);
		break;
	case TENSORD__REQUEST__BODY_RESERVE:
		dispatch_do_reserve(cl, req->id, req->reserve);
		break;
	case TENSORD__REQUEST__BODY_UNRESERVE:
		dispatch_do_unreserve(cl, req->unreserve);
		break;
	case TENSORD__REQUEST__BODY_BIND_PAGE:
		dispatch_do_bind_page(cl, req->id);
		break;
	case TENSORD__REQUEST__BODY_PEER_LIST:
		inspect_peers(cl, req->id);
		break;
	case TENSORD__REQUEST__BODY_READOPT:
		dispatch_do_readopt(cl, req->id, req->readopt);
		break;
	case TENSORD__REQUEST__BODY_RESOLVE:
		dispatch_do_resolve(cl, req->id, req->resolve);
		break;
	default:
		reply_status(c, 0, req->id, -EBADMSG, "unknown request type");
		break;
	}
	if (cl->srv->seqs)
		seqs_disarm(cl->srv->seqs);
}

void dispatch_frame(struct conn *c, const uint8_t *payload, size_t len, void *ctx)
{
	struct client *cl = conn_data(c);
	Tensord__Request *req;

	arena.used = 0;
	req = tensord__request__unpack(&arena_allocator, len, payload);
	cl->requests++;
	metrics_request(req ? (unsigned)req->body_case : 0);
	if (!req) {
		conn_log_limited(c, TD_LOG_DEBUG, LOG_KIND_BAD_FRAME,
				 "conn %llu: pid %u sent a malformed request (%zu bytes)",
				 (unsigned long long)c->id, cl->rc.pid, len);
		/* The framing is intact, so the connection can go on. */
		reply_status(c, 0, 0, -EBADMSG, "malformed request: not a tensord.Request message");
		return;
	}
	dispatch_request(cl, req);
	arena.used = 0;
}

static const char *change_name(const void *v, size_t i, size_t *ret_len)
{
	const struct reg_change *c = &((const struct reg_change *)v)[i];

	*ret_len = c->name_len;
	return c->name;
}

void dispatch_on_commit(void *ctx, const struct reg_change *v, size_t n, bool lost)
{
	struct server *srv = ctx;

	/* What a client's request did, remembered and logged with the step. */
	dispatch_seqs_step(srv, v, n);
	/* Recorded before anyone hears of it: what a client is told survives a crash. */
	state_on_commit(srv->state, v, n, lost);
	for (size_t i = 0; i < n; i++)
		if (v[i].kind == REG_PUBLISHED)
			waiters_wake(&srv->waiters, v[i].name, v[i].name_len, v[i].generation);
	if (n)
		waiters_wake_sets(&srv->waiters, v, n, change_name);
	watch_on_commit(srv, v, n, lost);
	remote_on_commit(&srv->remote, v, n, lost);
}

void dispatch_on_retired_gone(void *ctx, const struct tensor *t)
{
	struct server *srv = ctx;

	state_on_retired_gone(srv->state, t);
}

void dispatch_open(struct conn *c, void *ctx)
{
	struct client *cl = conn_data(c);

	cl->srv = ctx;
	cl->conn = c;
	cl->waits.data = cl;
	LIST_INIT(&cl->watches);
	registry_client_init(&cl->rc, c->id, c->uid, c->gid, c->pid);
	inspect_client_opened(cl);
	figure_count(FIG_connections_total, 1);
}

void dispatch_drained(struct conn *c, void *ctx)
{
	watch_drained(conn_data(c));
}

void dispatch_protocol_error(struct conn *c, int status, const char *msg, void *ctx)
{
	metrics_request(0);
	reply_status(c, 0, 0, status, msg);
}

void dispatch_close(struct conn *c, void *ctx)
{
	struct client *cl = conn_data(c);
	struct server *srv = cl->srv;
	struct reg_hold *hold;

	log_debug("conn %llu: pid %u closed, dropping %u leases", (unsigned long long)c->id,
		  cl->rc.pid, cl->rc.n_leases);
	quota_uncharge(&srv->quota, cl->rc.uid, QUOTA_WAITERS, cl->waits.n_waiters);
	if (cl->token && srv->seqs)
		seqs_close(srv->seqs, cl->token);
	waiters_drop_owner(&srv->waiters, &cl->waits);
	remote_client_gone(&cl->srv->remote, cl);
	watch_client_gone(cl);
	/* Allocations in flight complete without it (create_done()). */
	dispatch_create_forget(cl);
	/*
	 * Its legacy IPC leases may still be open in its process: tensord_close()
	 * releases them before its socket shuts, so any still held means the
	 * connection ended some other way (the daemon closed it, the process
	 * died, the socket was shut from outside). Their memory stays until that
	 * process has exited (docs/gpu.md).
	 */
	hold = registry_client_hold(&srv->reg, &cl->rc);
	registry_client_gone(&srv->reg, &cl->rc);
	if (!hold)
		return;
	conn_log_limited(
		c, TD_LOG_INFO, LOG_KIND_QUARANTINE,
		"conn %llu: pid %u: connection ended holding %u legacy IPC lease%s it may "
		"still have open: their memory (%llu bytes) is kept until the process exits",
		(unsigned long long)c->id, hold->pid, hold->n, hold->n == 1 ? "" : "s",
		(unsigned long long)hold->bytes);
	quarantine_add(&srv->quarantine, hold,
		       quota_fd_room(&srv->quota, c->uid) ? conn_peer_pidfd(c) : -EMFILE);
}
