/*
 * Idempotent writes (docs/restart.md, section 5): what each client's
 * effecting requests did is remembered (daemon/persist/seqs.h) as their
 * commit steps are made, and Resolve tells a client whose connection was
 * lost whether its put, publish, commit or unlink took effect, with the
 * result its reply would have carried.
 */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>

#include "daemon/base/log.h"
#include "dispatch.h"
#include "dispatch_int.h"
#include "reply.h"
#include "server.h"

void dispatch_seqs_arm(struct client *cl, const Tensord__Request *req)
{
	struct seqs *s = cl->srv->seqs;
	enum seq_kind kind = 0;

	if (!s || !req->seq || !cl->token)
		return;
	switch (req->body_case) {
	case TENSORD__REQUEST__BODY_PUT:
		/* A member of a transaction takes effect at its commit. */
		if (req->put->create && !req->put->create->tx)
			kind = SEQ_PUBLISHED;
		break;
	case TENSORD__REQUEST__BODY_PUBLISH:
		kind = SEQ_PUBLISHED;
		break;
	case TENSORD__REQUEST__BODY_COMMIT:
		kind = SEQ_COMMITTED;
		break;
	case TENSORD__REQUEST__BODY_UNLINK:
		if (!req->unlink->tx)
			kind = SEQ_UNLINKED;
		break;
	default:
		break;
	}
	if (kind)
		seqs_arm(s, cl->token, cl->rc.uid, req->seq, kind);
}

void dispatch_seqs_step(struct server *srv, const struct reg_change *v, size_t n)
{
	struct rec_seq res = { 0 };

	if (!srv->seqs)
		return;
	if (!n)
		return;
	if (!seqs_armed(srv->seqs)) {
		seqs_step(srv->seqs, NULL); /* no request's: nothing logged with it */
		return;
	}
	/* What the request's reply says: reply_published(), reply_commit(). */
	res.commit = v[n - 1].commit;
	for (size_t i = 0; i < n; i++) {
		if (v[i].kind == REG_PUBLISHED) {
			res.published++;
			res.generation = v[i].generation;
		} else {
			res.unlinked++;
		}
	}
	/* A step of another kind is not the request's own: it stays armed for its own. */
	if ((seqs_armed_kind(srv->seqs) == SEQ_PUBLISHED && !res.published) ||
	    (seqs_armed_kind(srv->seqs) == SEQ_UNLINKED && !res.unlinked)) {
		seqs_step(srv->seqs, NULL);
		return;
	}
	seqs_step(srv->seqs, &res);
}

void dispatch_do_resolve(struct client *cl, uint64_t id, const Tensord__Resolve *m)
{
	Tensord__Reply rep = TENSORD__REPLY__INIT;
	Tensord__ResolveReply rr = TENSORD__RESOLVE_REPLY__INIT;
	struct rec_seq res = { 0 };
	char why[300];
	int r;

	/* A test's crash with a Resolve unanswered (tests/python/test_idempotent.py). */
	{
		static long kill_at = -1;

		if (kill_at < 0) {
			const char *k = getenv("TENSORD_TEST_KILL_AT_RESOLVE");

			kill_at = k && *k ? strtol(k, NULL, 10) : 0;
		}
		if (kill_at > 0 && --kill_at == 0)
			raise(SIGKILL);
	}
	if (!cl->srv->seqs || !m->token || !m->seq) {
		snprintf(why, sizeof(why), "resolve: %s",
			 !cl->srv->seqs ? "this daemon keeps no requests' results"
					: "a token and a seq are needed");
		reply_status(cl->conn, TENSORD__REQUEST__BODY_RESOLVE, id,
			     cl->srv->seqs ? -EINVAL : -ESTALE, why);
		return;
	}
	r = seqs_resolve(cl->srv->seqs, m->token, cl->rc.uid, m->seq,
			 m->instance != reply_instance(), cl->token == m->token, &res, why,
			 sizeof(why));
	log_debug("conn %llu: pid %u: resolve of token %016llx: %s",
		  (unsigned long long)cl->conn->id, cl->rc.pid, (unsigned long long)m->token, why);
	if (r < 0) {
		reply_status(cl->conn, TENSORD__REQUEST__BODY_RESOLVE, id, r, why);
		return;
	}
	rr.applied = r == 1;
	if (rr.applied) {
		rr.kind = res.kind;
		rr.generation = res.generation;
		rr.commit = res.commit;
		rr.published = res.published;
		rr.unlinked = res.unlinked;
	}
	rep.id = id;
	rep.body_case = TENSORD__REPLY__BODY_RESOLVE;
	rep.resolve = &rr;
	reply_send(cl->conn, &rep, NULL);
}
