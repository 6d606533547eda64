/*
 * Sets (docs/design.md, "Reading a set: attach_many"): AttachMany resolves
 * a list of names or a prefix, leases every member in one step, and
 * answers with all the leases; with `after` it waits, as a set waiter,
 * for a commit newer than that to touch the set. Cancel answers a parked
 * wait of the connection with ECANCELED.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/desc.h"
#include "dispatch_int.h"
#include "figures.h"
#include "daemon/base/log.h"
#include "metrics.h"
#include "reply.h"
#include "server.h"

static int cmp_str(const void *a, const void *b)
{
	return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/*
 * The waiter_set of m (one allocation, the caller's to free): its names
 * checked, sorted and without repeats, or its prefix; and the client's
 * share ids. 0, or -errno with the reason.
 */
static int set_from(const Tensord__AttachMany *m, struct waiter_set **ret, char *why,
		    size_t why_len)
{
	size_t bytes = 0, n = m->n_names, k = 0;
	size_t plen = strlen(m->prefix);
	struct waiter_set *s;
	char *p;
	int r;

	if (n > DISPATCH_SET_MAX) {
		snprintf(why, why_len, "attach_many: %zu names, the most one set may have is %u", n,
			 DISPATCH_SET_MAX);
		return -E2BIG;
	}
	for (size_t i = 0; i < n; i++) {
		r = dispatch_check_name(m->names[i], why, why_len);
		if (r < 0)
			return r;
		bytes += strlen(m->names[i]) + 1;
	}
	if (!n && plen) {
		char reason[300];

		if (td_name_check(m->prefix, plen, reason, sizeof(reason)) < 0) {
			snprintf(why, why_len, "attach_many: prefix: %s", reason);
			return -EINVAL;
		}
	}
	s = calloc(1,
		   sizeof(*s) + n * sizeof(char *) + m->n_have_shares * sizeof(uint64_t) + bytes);
	if (!s) {
		snprintf(why, why_len, "attach_many: out of memory for %zu names", n);
		return -ENOMEM;
	}
	/* The pointers and share ids first (aligned), the names' bytes after. */
	s->have_shares = (uint64_t *)s->bytes;
	s->name = (const char **)(s->have_shares + m->n_have_shares);
	p = (char *)(s->name + n);
	s->n_have_shares = m->n_have_shares;
	if (m->n_have_shares)
		memcpy(s->have_shares, m->have_shares, m->n_have_shares * sizeof(uint64_t));
	for (size_t i = 0; i < n; i++) {
		size_t len = strlen(m->names[i]) + 1;

		memcpy(p, m->names[i], len);
		s->name[i] = p;
		p += len;
	}
	qsort(s->name, n, sizeof(*s->name), cmp_str);
	for (size_t i = 0; i < n; i++)
		if (!k || strcmp(s->name[k - 1], s->name[i]) != 0)
			s->name[k++] = s->name[i];
	s->n_names = k;
	if (!n) {
		memcpy(s->prefix, m->prefix, plen + 1);
		s->prefix_len = plen;
	}
	*ret = s;
	return 0;
}

/* What a set is now, for rc. */
struct members {
	struct tensor **v; /* owned; n of them, in name order */
	size_t n;
	uint64_t commit;     /* the newest commit among them */
	uint64_t touched;    /* the newest commit that published or unlinked a name of the set */
	const char *missing; /* a listed name not published (borrowed from the set), or NULL */
	int err;             /* -EACCES for a listed name rc may not read (why says which) */
};

/* The members under s's prefix, in pages of the list's, at most DISPATCH_SET_MAX visited. */
static int resolve_prefix(struct registry *reg, struct reg_client *rc, const struct waiter_set *s,
			  struct members *m)
{
	struct tensor *page[DISPATCH_LIST_PAGE];
	char after[TENSORD_NAME_MAX + 1] = "";
	size_t cap = 0, visited = 0;
	const char *next;

	do {
		size_t n;

		registry_list(reg, rc, s->prefix, s->prefix_len, after, DISPATCH_LIST_PAGE, page,
			      &n, &next);
		visited += n;
		for (size_t i = 0; i < n; i++) {
			if (page[i]->state != TENSORD_STATE_PUBLISHED ||
			    !registry_may_read(page[i], rc))
				continue;
			if (m->n == cap) {
				struct tensor **nv;

				cap = cap ? 2 * cap : 64;
				nv = realloc(m->v, cap * sizeof(*nv));
				if (!nv)
					return -ENOMEM;
				m->v = nv;
			}
			m->v[m->n++] = page[i];
		}
		if (next)
			snprintf(after, sizeof(after), "%s", next);
	} while (next && visited < DISPATCH_SET_MAX);
	/* Unlinks of names rc may not read are no news to it (registry_may_hear()). */
	m->touched = registry_tombs_newest(reg, rc, s->prefix, s->prefix_len);
	return 0;
}

/* The members of s as rc may read them now, into *m (free m->v). 0 or -ENOMEM. */
static int resolve(struct registry *reg, struct reg_client *rc, const struct waiter_set *s,
		   struct members *m, char *why, size_t why_len)
{
	uint64_t gen, commit;

	memset(m, 0, sizeof(*m));
	/* Unpublished tensors of rc's own are no members. */
	if (!s->n_names && resolve_prefix(reg, rc, s, m) < 0)
		return -ENOMEM;
	if (s->n_names && !(m->v = malloc(s->n_names * sizeof(*m->v))))
		return -ENOMEM;
	for (size_t i = 0; i < s->n_names; i++) {
		struct tensor *t = registry_lookup(reg, rc, s->name[i], strlen(s->name[i]));

		if (registry_tomb(reg, rc, s->name[i], strlen(s->name[i]), &gen, &commit) &&
		    commit > m->touched)
			m->touched = commit;
		if (!t || t->state != TENSORD_STATE_PUBLISHED) {
			m->missing = m->missing ? m->missing : s->name[i];
			continue;
		}
		if (!registry_may_read(t, rc) && !m->err) {
			snprintf(why, why_len, "tensor '%s': mode %03o refuses uid %u", t->name,
				 t->mode, rc->uid);
			m->err = -EACCES;
		}
		m->v[m->n++] = t;
	}
	for (size_t i = 0; i < m->n; i++) {
		/* A remote set's: its origin's commit (the replicas are all of one there). */
		if (tensor_shown_commit(m->v[i]) > m->commit)
			m->commit = tensor_shown_commit(m->v[i]);
	}
	if (m->commit > m->touched)
		m->touched = m->commit;
	return 0;
}

/* Whether m answers a request for s with after: all there, and touched since. */
static bool ready(const struct waiter_set *s, const struct members *m, uint64_t after, bool waiting)
{
	if (m->err)
		return true; /* answered with the error */
	if (s->n_names && m->missing)
		return false;
	if (after)
		return m->touched > after;
	return !waiting || s->n_names || m->n;
}

/* Whether the client holds share (a slab) already, or got its descriptor earlier in this reply. */
static bool share_known(uint64_t share, const uint64_t *v, size_t n)
{
	for (size_t i = 0; share && i < n; i++)
		if (v[i] == share)
			return true;
	return false;
}

/*
 * Leases every member of m for cl and answers request id with them, in
 * parts of at most DISPATCH_SET_PART leases (a frame carries their
 * descriptors). On a failure no lease is left and the error is answered.
 */
static void serve(struct client *cl, uint64_t id, const struct waiter_set *s,
		  const struct members *m)
{
	struct registry *reg = &cl->srv->reg;
	uint64_t *lease = calloc(m->n ? m->n : 1, sizeof(*lease));
	uint64_t *sent = calloc(m->n + s->n_have_shares + 1, sizeof(*sent));
	struct reply_lease_store *st = calloc(DISPATCH_SET_PART, sizeof(*st));
	Tensord__Lease *pl[DISPATCH_SET_PART];
	struct conn_fd_ticket tk[DISPATCH_SET_PART];
	size_t n_sent = s->n_have_shares, i, done = 0;
	char why[400];
	bool *writable = calloc(m->n ? m->n : 1, sizeof(*writable));
	int r = 0;

	if (!lease || !sent || !st || !writable) {
		reply_status(cl->conn, TENSORD__REQUEST__BODY_ATTACH_MANY, id, -ENOMEM,
			     "attach_many: out of memory");
		goto out;
	}
	if (s->n_have_shares)
		memcpy(sent, s->have_shares, s->n_have_shares * sizeof(*sent));
	/* Every lease in this one step, or none. */
	for (i = 0; i < m->n && r == 0; i++) {
		struct tensor *t;

		r = registry_attach(reg, &cl->rc, m->v[i]->name, m->v[i]->name_len, &t, &lease[i],
				    &writable[i], why, sizeof(why));
	}
	if (r < 0) {
		for (size_t j = 0; j + 1 < i; j++)
			registry_release(reg, &cl->rc, lease[j]);
		reply_status(cl->conn, TENSORD__REQUEST__BODY_ATTACH_MANY, id, r, why);
		goto out;
	}
	do {
		Tensord__Reply rep = TENSORD__REPLY__INIT;
		Tensord__AttachManyReply ar = TENSORD__ATTACH_MANY_REPLY__INIT;
		size_t n = m->n - done < DISPATCH_SET_PART ? m->n - done : DISPATCH_SET_PART,
		       n_tk = 0;

		for (size_t k = 0; k < n; k++) {
			struct tensor *t = m->v[done + k];
			uint64_t share = t->alloc.share_id;

			reply_fill_lease(&st[k], t, lease[done + k], writable[done + k], false);
			pl[k] = &st[k].lease;
			/* Every lease has a ticket, so that a failed export ends them
			 * all; only those whose memory the client lacks carry a
			 * descriptor. */
			tk[n_tk++] = (struct conn_fd_ticket){
				.req_id = id,
				.kind = TENSORD__REQUEST__BODY_ATTACH_MANY,
				.lease = lease[done + k],
				.writable = writable[done + k],
				.no_fd = !dispatch_lease_has_fd(t) ||
					 share_known(share, sent, n_sent),
			};
			st[k].lease.fd = !tk[n_tk - 1].no_fd;
			if (!tk[n_tk - 1].no_fd && share)
				sent[n_sent++] = share;
		}
		ar.commit = m->commit;
		ar.n_leases = n;
		ar.leases = pl;
		ar.more = done + n < m->n;
		rep.id = id;
		rep.body_case = TENSORD__REPLY__BODY_ATTACH_MANY;
		rep.attach_many = &ar;
		reply_send_fds(cl->conn, &rep, tk, n_tk);
		done += n;
	} while (done < m->n && !conn_gone(cl->conn));
	for (size_t k = 0; k < m->n; k++)
		metrics_attach_served();
	log_debug("conn %llu: %zu leases of a set, commit %llu", (unsigned long long)cl->conn->id,
		  m->n, (unsigned long long)m->commit);
out:
	free(writable);
	free(st);
	free(sent);
	free(lease);
}

/* Answers request id for set s (after, waiting) now, or says it must wait (1). */
static int try_now(struct client *cl, uint64_t id, const struct waiter_set *s, uint64_t after,
		   bool waiting)
{
	struct members m;
	char why[400];
	int r = resolve(&cl->srv->reg, &cl->rc, s, &m, why, sizeof(why));

	if (r < 0) {
		free(m.v);
		reply_status(cl->conn, TENSORD__REQUEST__BODY_ATTACH_MANY, id, r,
			     "attach_many: out of memory");
		return 0;
	}
	if (!ready(s, &m, after, waiting)) {
		free(m.v);
		if (waiting)
			return 1;
		if (m.missing)
			snprintf(why, sizeof(why), "tensor '%s': no such tensor", m.missing);
		else
			snprintf(why, sizeof(why),
				 "attach_many: no commit newer than %llu touched the set yet",
				 (unsigned long long)after);
		reply_status(cl->conn, TENSORD__REQUEST__BODY_ATTACH_MANY, id,
			     m.missing ? -ENOENT : -ETIMEDOUT, why);
		return 0;
	}
	if (m.err)
		reply_status(cl->conn, TENSORD__REQUEST__BODY_ATTACH_MANY, id, m.err, why);
	else
		serve(cl, id, s, &m);
	free(m.v);
	return 0;
}

int dispatch_set_members(struct registry *reg, struct reg_client *rc, const Tensord__AttachMany *m,
			 struct tensor ***ret_v, size_t *ret_n, uint64_t *ret_commit, char *why,
			 size_t why_len)
{
	struct waiter_set *s;
	struct members mb;
	int r = set_from(m, &s, why, why_len);

	if (r < 0)
		return r;
	r = resolve(reg, rc, s, &mb, why, why_len);
	if (r < 0)
		snprintf(why, why_len, "attach_many: out of memory");
	else if (mb.missing)
		snprintf(why, why_len, "tensor '%s': no such tensor", mb.missing);
	r = r < 0 ? r : mb.missing ? -ENOENT : mb.err;
	free(s);
	if (r < 0) {
		free(mb.v);
		return r;
	}
	*ret_v = mb.v;
	*ret_n = mb.n;
	*ret_commit = mb.commit;
	return 0;
}

void dispatch_set_answer(struct client *cl, uint64_t id, const char *const *names, size_t n,
			 const uint64_t *have_shares, size_t n_have_shares)
{
	/* Replica names ("@PEER/NAME") pass no client's name check: the set is built here. */
	struct waiter_set *s;

	s = calloc(1, sizeof(*s) + n * sizeof(char *) + n_have_shares * sizeof(uint64_t));
	if (!s) {
		reply_status(cl->conn, TENSORD__REQUEST__BODY_ATTACH_MANY, id, -ENOMEM,
			     "attach_many: out of memory");
		return;
	}
	s->have_shares = (uint64_t *)s->bytes;
	s->name = (const char **)(s->have_shares + n_have_shares);
	s->n_have_shares = n_have_shares;
	if (n_have_shares)
		memcpy(s->have_shares, have_shares, n_have_shares * sizeof(uint64_t));
	for (size_t i = 0; i < n; i++)
		s->name[i] = names[i];
	s->n_names = n;
	if (n) {
		try_now(cl, id, s, 0, false);
	} else { /* no names would be a prefix of "": every name */
		struct members none = { 0 };

		serve(cl, id, s, &none);
	}
	free(s);
}

void dispatch_do_attach_many(struct client *cl, uint64_t id, const Tensord__AttachMany *m)
{
	struct waiter_req req = { .req_id = id, .after = m->after };
	struct waiter_set *s;
	char why[400];
	int r;

	r = set_from(m, &s, why, sizeof(why));

	if (r < 0) {
		reply_status(cl->conn, TENSORD__REQUEST__BODY_ATTACH_MANY, id, r, why);
		return;
	}
	if (try_now(cl, id, s, m->after, m->timeout_ms != 0) == 0) {
		free(s);
		return;
	}
	snprintf(why, sizeof(why), "attach_many of %s%s", s->n_names ? "names under " : "prefix ",
		 s->n_names ? s->name[0] : s->prefix);
	if (dispatch_waiter_charge(cl, TENSORD__REQUEST__BODY_ATTACH_MANY, id, why) < 0) {
		free(s);
		return;
	}
	req.set = s;
	if (waiters_add_set(&cl->srv->waiters, &cl->waits, &req, m->timeout_ms) < 0) {
		quota_uncharge(&cl->srv->quota, cl->rc.uid, QUOTA_WAITERS, 1);
		reply_status(cl->conn, TENSORD__REQUEST__BODY_ATTACH_MANY, id, -ENOMEM,
			     "out of memory for a waiter");
		return;
	}
	figure_count(FIG_attach_waits_total, 1);
}

bool dispatch_set_ready(struct waiter_owner *o, const struct waiter_req *req, void *ctx)
{
	struct client *cl = o->data;
	struct members m;
	char why[400];
	bool yes;

	if (resolve(&cl->srv->reg, &cl->rc, req->set, &m, why, sizeof(why)) < 0) {
		free(m.v);
		return true; /* answered with the error */
	}
	yes = ready(req->set, &m, req->after, true);
	free(m.v);
	return yes;
}

void dispatch_set_done(struct client *cl, const struct waiter_req *req, int status)
{
	char why[300];

	if (status == 0) {
		try_now(cl, req->req_id, req->set, req->after, false);
		return;
	}
	snprintf(why, sizeof(why), "attach_many: %s",
		 status == -ECANCELED ? "the wait was cancelled"
				      : "the set was not ready within the timeout");
	reply_status(cl->conn, TENSORD__REQUEST__BODY_ATTACH_MANY, req->req_id, status, why);
}
