/*
 * libtensord: transactions, put_many, attach_many, and operations driven
 * by an event loop (docs/design.md, "Versions, sets and watches").
 *
 * A transaction is a client-side id: its members are created and put with
 * it, its commit is one request. put_many pipelines its requests in
 * windows, so n tensors cost a few round trips instead of 2n. An
 * attach_many reply comes in parts, each frame with the descriptors of its
 * leases; the set is built once all are in. An operation is a request whose
 * answer tensord_poll() delivers; one abandoned before its answer is
 * cancelled, and what the answer brings is let go when it comes.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "client.h"
#include "common/desc.h"

/* --- transactions --------------------------------------------------------------- */

struct tensord_tx {
	tensord_client *c; /* a reference of its own */
	uint32_t id;
	bool over;  /* committed or aborted */
	char **own; /* names of members made with tensord_tx_create(): their views */
	size_t n_own, cap_own;
};

static int tx_usable(const tensord_tx *tx)
{
	if (!tx)
		return td_set_error(-EINVAL, "transaction: NULL");
	if (tx->over)
		return td_set_error(-ESRCH, "transaction %u: it is over (committed or aborted)",
				    tx->id);
	return 0;
}

int tensord_tx_begin(tensord_client *c, tensord_tx **ret_tx)
{
	tensord_tx *tx;
	int r = td_client_current(&c);

	if (r < 0)
		return r;
	if (!ret_tx)
		return td_set_error(-EINVAL, "transaction: NULL output");
	tx = calloc(1, sizeof(*tx));
	if (!tx)
		return td_set_error(-ENOMEM, "out of memory");
	do
		tx->id = atomic_fetch_add(&c->next_tx, 1) + 1;
	while (tx->id == 0);
	tx->c = c;
	td_client_ref(c);
	*ret_tx = tx;
	return 0;
}

/* Ends tx on the daemon's side (aborted), after a failure of the caller's. */
static void tx_fail(tensord_tx *tx)
{
	char saved[512];

	snprintf(saved, sizeof(saved), "%s", tensord_last_error());
	tensord_tx_abort(tx);
	td_set_error(-EIO, "%s", saved);
}

int tensord_tx_create(tensord_tx *tx, const char *name, const tensord_spec *spec,
		      DLManagedTensorVersioned **ret_tensor)
{
	char *own;
	int r = tx_usable(tx);

	if (r < 0)
		return r;
	if (!ret_tensor)
		return td_set_error(-EINVAL, "tensor '%s': NULL output", name ? name : "");
	if (tx->n_own == tx->cap_own) {
		size_t cap = tx->cap_own ? 2 * tx->cap_own : 16;
		char **nv = realloc(tx->own, cap * sizeof(*nv));

		if (!nv)
			return td_set_error(-ENOMEM, "out of memory");
		tx->own = nv;
		tx->cap_own = cap;
	}
	r = td_tx_create_raw(tx->c, tx->id, name, spec, ret_tensor);
	if (r < 0)
		return r;
	own = strdup(name);
	if (!own) {
		(*ret_tensor)->deleter(*ret_tensor);
		return td_set_error(-ENOMEM, "out of memory");
	}
	tx->own[tx->n_own++] = own;
	return 0;
}

int tensord_tx_put(tensord_tx *tx, const char *name, const DLTensor *src, uint32_t flags,
		   uint32_t mode)
{
	int r = tx_usable(tx);

	if (r < 0)
		return r;
	r = td_put(tx->c, name, src, flags, mode, tx->id, NULL);
	/* A member half made is the transaction's end: nothing of it shows. */
	if (r < 0 && r != -EINVAL && r != -EFAULT) {
		int keep = r;

		tx_fail(tx);
		return td_set_error(keep, "%s", tensord_last_error());
	}
	return r;
}

int tensord_tx_unlink(tensord_tx *tx, const char *name)
{
	Tensord__Request req = TENSORD__REQUEST__INIT;
	Tensord__Unlink ul = TENSORD__UNLINK__INIT;
	Tensord__Reply *rep;
	char why[300];
	int r = tx_usable(tx);

	if (r < 0)
		return r;
	if (!name || td_name_check(name, strlen(name), why, sizeof(why)) < 0)
		return td_set_error(-EINVAL, "%s", name ? why : "name is NULL");
	ul.name = (char *)name;
	ul.tx = tx->id;
	req.body_case = TENSORD__REQUEST__BODY_UNLINK;
	req.unlink = &ul;
	r = td_rpc(tx->c, &req, &rep, NULL);
	if (r == 0)
		tensord__reply__free_unpacked(rep, NULL);
	return r;
}

int tensord_tx_commit(tensord_tx *tx, uint64_t *ret_commit)
{
	Tensord__Request req = TENSORD__REQUEST__INIT;
	Tensord__Commit cm = TENSORD__COMMIT__INIT;
	struct td_own_view *views = NULL;
	Tensord__Reply *rep;
	size_t n = 0;
	int r = tx_usable(tx);

	if (r < 0)
		return r;
	/* The members' own writable views go private first: the daemon seals them. */
	views = calloc(tx->n_own ? tx->n_own : 1, sizeof(*views));
	if (!views)
		return td_set_error(-ENOMEM, "out of memory");
	for (; n < tx->n_own && r == 0; n++)
		r = td_own_view_prepare(tx->c, tx->own[n], &views[n]);
	if (r == 0) {
		cm.tx = tx->id;
		req.body_case = TENSORD__REQUEST__BODY_COMMIT;
		req.commit = &cm;
		r = td_rpc(tx->c, &req, &rep, NULL);
	} else {
		n--; /* the one that failed holds nothing */
		tx_fail(tx);
	}
	for (size_t i = 0; i < n; i++)
		td_own_view_done(tx->c, &views[i], r == 0);
	free(views);
	tx->over = true;
	if (r < 0)
		return r;
	if (ret_commit)
		*ret_commit =
			rep->body_case == TENSORD__REPLY__BODY_COMMIT ? rep->commit->commit : 0;
	tensord__reply__free_unpacked(rep, NULL);
	return 0;
}

int tensord_tx_abort(tensord_tx *tx)
{
	Tensord__Request req = TENSORD__REQUEST__INIT;
	Tensord__Abort ab = TENSORD__ABORT__INIT;
	Tensord__Reply *rep;
	int r = tx_usable(tx);

	if (r < 0)
		return r;
	tx->over = true;
	ab.tx = tx->id;
	req.body_case = TENSORD__REQUEST__BODY_ABORT;
	req.abort = &ab;
	r = td_rpc(tx->c, &req, &rep, NULL);
	if (r == 0)
		tensord__reply__free_unpacked(rep, NULL);
	/* Nothing staged yet: the daemon never heard of it, and there is nothing to undo. */
	return r == -ENOENT ? 0 : r;
}

tensord_tx *tensord_tx_free(tensord_tx *tx)
{
	if (!tx)
		return NULL;
	if (!tx->over)
		tensord_tx_abort(tx);
	for (size_t i = 0; i < tx->n_own; i++)
		free(tx->own[i]);
	free(tx->own);
	td_client_unref(tx->c);
	free(tx);
	return NULL;
}

/* --- put_many ----------------------------------------------------------------------- */

/*
 * Flow control. Requests go out while earlier answers are unread, so the
 * daemon must be able to take them while this thread is not reading: it
 * stops reading a client that has not read its replies' descriptors
 * (--max-fds-in-flight-per-conn, 64 by default) or 4 MiB of replies, and a
 * send that finds the socket full would then wait forever. So at most
 * PUT_WINDOW requests are unanswered (below the default descriptor cap, so
 * the daemon keeps reading), and at most PUT_BYTES_IN_FLIGHT bytes of them
 * (two inline puts of 64 KiB and change). Even with a lower cap that much
 * fits in a Unix socket's buffer (208 KiB by default, each frame charged
 * its payload and about 1 KiB). Past either bound the oldest answer is
 * read first, and the next request goes out as each answer comes in.
 */
#define PUT_WINDOW 32
#define PUT_BYTES_IN_FLIGHT (160u * 1024u)

/* One item's request, readied, then in flight. */
struct put_slot {
	struct td_pending p;
	union {
		struct td_put_msg put;
		struct td_create_req create;
	} m;
	bool inline_bytes;
	bool on_device; /* copied on the device when its turn comes, not pipelined */
	uint8_t *buf;   /* owned: the inline bytes, until the request is sent */
	size_t cost;    /* the request's bytes on the wire */
	const tensord_put_item *item;
};

/* The answer to one slot: the put's status, or the create's lease written and ended. */
static int put_finish(tensord_client *c, struct put_slot *s, int r)
{
	Tensord__Lease *w;

	if (r == 0)
		r = td_rpc_end(c, &s->p);
	else
		td_rpc_end(c, &s->p);
	if (r == 0 && !s->inline_bytes) {
		if (s->p.reply->body_case != TENSORD__REPLY__BODY_LEASE) {
			r = td_set_error(-EPROTO,
					 "tensor '%s': tensord answered create without a "
					 "lease",
					 s->item->name);
		} else {
			w = s->p.reply->lease;
			if (w->handle != TENSORD__HANDLE_KIND__HANDLE_NONE && s->p.fd < 0)
				r = td_set_error(-EPROTO, "tensor '%s': no descriptor to write",
						 s->item->name);
			else if (s->p.fd >= 0)
				r = td_put_write(s->p.fd, s->item->name, s->item->src);
			td_lease_end(c, w->lease);
		}
	}
	td_pending_clear(&s->p);
	free(s->buf);
	s->buf = NULL;
	return r;
}

/* Readies item's request in s: inline bytes when they fit, else a create. */
static int put_prepare(tensord_client *c, uint32_t tx, struct put_slot *s,
		       const tensord_put_item *item, uint32_t flags, uint32_t mode)
{
	tensord_spec spec;
	uint64_t nbytes;
	int r;

	memset(s, 0, sizeof(*s));
	s->item = item;
	if (item->src && td_device_is_gpu(item->src->device.device_type)) {
		s->on_device = true;
		return 0;
	}
	r = td_put_check(item->name, item->src, flags, mode, &spec, &nbytes);
	if (r < 0)
		return r;
	if (nbytes <= TD_PUT_INLINE_MAX) {
		const uint8_t *bytes = td_put_compact(item->src);

		if (!bytes) {
			s->buf = malloc(nbytes ? nbytes : 1);
			if (!s->buf)
				return td_set_error(-ENOMEM, "out of memory");
			td_put_gather(item->src, s->buf);
			bytes = s->buf;
		}
		r = td_put_msg(&s->m.put, item->name, &spec, tx, bytes, nbytes,
			       c->conn.max_request);
		s->inline_bytes = r == 0;
		if (r == -EMSGSIZE)
			r = 0; /* a long name and shape: a create after all */
	}
	if (r == 0 && !s->inline_bytes)
		r = td_create_msg(&s->m.create, item->name, &spec, tx);
	if (r == 0)
		s->cost = TD_FRAME_HEADER +
			  tensord__request__get_packed_size(s->inline_bytes ? &s->m.put.req
									    : &s->m.create.req);
	if (r < 0) {
		free(s->buf);
		s->buf = NULL;
	}
	return r;
}

/* Sends what put_prepare() readied. */
static int put_start(tensord_client *c, struct put_slot *s)
{
	int r = td_rpc_start(c, s->inline_bytes ? &s->m.put.req : &s->m.create.req, &s->p);

	/* The request went out packed: its bytes are not needed again, and
	 * one buffer reused item after item stays warm in the cache. */
	free(s->buf);
	s->buf = NULL;
	return r;
}

int tensord_put_many(tensord_client *c, const tensord_put_item *items, size_t n, uint32_t flags,
		     uint32_t mode, uint64_t *ret_commit)
{
	struct put_slot *slots, *s;
	size_t oldest = 0, next = 0, bytes = 0;
	bool ready = false; /* slots[next % PUT_WINDOW] is readied, not yet sent */
	tensord_tx *tx = NULL;
	int r = td_client_current(&c);

	if (r < 0)
		return r;
	if (!items && n)
		return td_set_error(-EINVAL, "put_many: no items");
	slots = calloc(PUT_WINDOW, sizeof(*slots));
	if (!slots)
		return td_set_error(-ENOMEM, "out of memory");
	r = tensord_tx_begin(c, &tx);
	while (oldest < next || (r == 0 && next < n)) {
		if (r == 0 && next < n && next - oldest < PUT_WINDOW) {
			s = &slots[next % PUT_WINDOW];
			if (!ready) {
				r = put_prepare(c, tx->id, s, &items[next], flags, mode);
				ready = r == 0;
				if (r < 0)
					continue;
			}
			/* The first in flight always goes: it fits in any request. */
			if (oldest == next || bytes + s->cost <= PUT_BYTES_IN_FLIGHT) {
				if (!s->on_device && (r = put_start(c, s)) < 0)
					continue;
				ready = false;
				bytes += s->cost;
				next++;
				continue;
			}
		}
		/* Full, or nothing more to send: the oldest answer. */
		s = &slots[oldest % PUT_WINDOW];
		if (s->on_device) {
			if (r == 0)
				r = td_put(c, s->item->name, s->item->src, flags, mode, tx->id,
					   NULL);
		} else {
			int ri;

			td_rpc_wait(c, &s->p);
			ri = put_finish(c, s, r);
			r = r < 0 ? r : ri;
		}
		bytes -= s->cost;
		oldest++;
	}
	if (ready) {
		/* Readied, then an answer failed: never sent. */
		free(slots[next % PUT_WINDOW].buf);
	}
	if (r == 0)
		r = tensord_tx_commit(tx, ret_commit);
	else if (tx)
		tx_fail(tx);
	tensord_tx_free(tx);
	free(slots);
	return r;
}

/* --- attach_many -------------------------------------------------------------------- */

/* An AttachMany request and what it points into. */
struct set_req {
	Tensord__Request req;
	Tensord__AttachMany am;
	uint64_t have_shares[TD_SHARES_MAX];
};

static int set_msg(tensord_client *c, struct set_req *m, const char *const *names, size_t n,
		   const char *prefix, uint64_t after, int timeout_ms)
{
	char why[300];
	size_t peer_len;

	tensord__request__init(&m->req);
	tensord__attach_many__init(&m->am);
	for (size_t i = 0; i < n; i++) {
		if (!names[i])
			return td_set_error(-EINVAL, "attach_many: name %zu is NULL", i);
		/* Another node's set names "@PEER/NAME" (docs/remote.md, "Sets"). */
		if (names[i][0] == '@'
			    ? td_remote_name_check(names[i], strlen(names[i]), &peer_len, why,
						   sizeof(why)) < 0
			    : td_name_check(names[i], strlen(names[i]), why, sizeof(why)) < 0)
			return td_set_error(-EINVAL, "%s", why);
	}
	prefix = prefix ? prefix : "";
	/* "@PEER/PREFIX", whose PEER/ alone is the whole export: tensord checks it. */
	if (!names && *prefix && *prefix != '@' &&
	    td_name_check(prefix, strlen(prefix), why, sizeof(why)) < 0)
		return td_set_error(-EINVAL, "attach_many: prefix: %s", why);
	m->am.n_names = names ? n : 0;
	m->am.names = (char **)names;
	m->am.prefix = names ? "" : (char *)prefix;
	m->am.after = after;
	m->am.timeout_ms = timeout_ms;
	m->am.n_have_shares = td_mapcache_share_ids(&c->maps, m->have_shares, TD_SHARES_MAX);
	m->am.have_shares = m->have_shares;
	m->req.body_case = TENSORD__REQUEST__BODY_ATTACH_MANY;
	m->req.attach_many = &m->am;
	return 0;
}

/* Ends the leases a failed or abandoned set's parts granted. */
static void set_let_go(tensord_client *c, struct td_pending *p)
{
	for (struct td_part *part = p->parts; part; part = part->next)
		for (size_t i = 0; i < part->reply->attach_many->n_leases; i++)
			td_lease_end(c, part->reply->attach_many->leases[i]->lease);
	td_pending_clear(p);
}

/* The set p's parts grant, built into *ret_set. Consumes what p holds. */
static int set_build(tensord_client *c, struct td_pending *p, tensord_set **ret_set)
{
	size_t n = 0, bytes = 0, k = 0;
	uint64_t commit = 0;
	tensord_set *s;
	char *names;
	int r = 0;

	for (struct td_part *part = p->parts; part; part = part->next) {
		Tensord__AttachManyReply *ar = part->reply->attach_many;

		commit = ar->commit;
		n += ar->n_leases;
		for (size_t i = 0; i < ar->n_leases; i++)
			bytes += ar->leases[i]->info ? strlen(ar->leases[i]->info->name) + 1 : 1;
	}
	s = calloc(1,
		   sizeof(*s) + n * (sizeof(char *) + sizeof(DLManagedTensorVersioned *)) + bytes);
	if (!s) {
		set_let_go(c, p);
		return td_set_error(-ENOMEM, "attach_many: out of memory for %zu tensors", n);
	}
	s->commit = commit;
	s->tensors = (DLManagedTensorVersioned **)(s + 1);
	s->names = (const char *const *)(s->tensors + n);
	names = (char *)(s->names + n);
	for (struct td_part *part = p->parts; part; part = part->next) {
		Tensord__AttachManyReply *ar = part->reply->attach_many;
		unsigned fd_at = 0;

		for (size_t i = 0; i < ar->n_leases; i++, k++) {
			Tensord__Lease *w = ar->leases[i];
			int fd = -1;
			struct td_lease *l;

			if (w->fd && fd_at < part->n_fds) {
				fd = part->fds[fd_at];
				part->fds[fd_at++] = -1; /* the lease's now */
			} else if (w->fd && r == 0) {
				r = td_set_error(-EPROTO, "attach_many: tensord sent fewer "
							  "descriptors than its leases say");
			}
			if (r < 0) {
				if (fd >= 0)
					close(fd);
				td_lease_end(c, w->lease);
				continue;
			}
			((const char **)s->names)[k] = names;
			snprintf(names, bytes, "%s", w->info ? w->info->name : "");
			bytes -= strlen(names) + 1;
			names += strlen(names) + 1;
			r = td_lease_from_reply(c, w, fd, NULL, false, &l);
			if (r == 0)
				r = td_lease_handle(l, &s->tensors[k]);
		}
	}
	s->n = k;
	td_pending_clear(p);
	if (r < 0) {
		tensord_set_free(s);
		return r;
	}
	*ret_set = s;
	return 0;
}

int tensord_attach_many(tensord_client *c, const char *const *names, size_t n_names,
			const char *prefix, uint64_t after, int timeout_ms, tensord_set **ret_set)
{
	struct td_pending p = { .multi = true };
	struct set_req m;
	int r = td_client_current(&c);

	if (r == 0 && !ret_set)
		r = td_set_error(-EINVAL, "attach_many: NULL output");
	if (r == 0)
		r = set_msg(c, &m, names, n_names, prefix, after, timeout_ms);
	if (r == 0)
		r = td_rpc_start(c, &m.req, &p);
	if (r < 0)
		return r;
	td_rpc_wait(c, &p);
	r = td_rpc_end(c, &p);
	if (r < 0) {
		char saved[512];

		snprintf(saved, sizeof(saved), "%s", tensord_last_error());
		set_let_go(c, &p);
		return td_set_error(r, "%s", saved);
	}
	return set_build(c, &p, ret_set);
}

tensord_set *tensord_set_free(tensord_set *s)
{
	if (!s)
		return NULL;
	for (size_t i = 0; i < s->n; i++)
		if (s->tensors[i])
			s->tensors[i]->deleter(s->tensors[i]);
	free(s);
	return NULL;
}

/* --- operations for event loops ---------------------------------------------------------- */

enum op_kind { OP_ATTACH, OP_ATTACH_MANY };

struct tensord_op {
	tensord_client *c; /* a reference of its own */
	enum op_kind kind;
	struct td_pending *p; /* heap: abandoned with the op when unanswered */
	struct td_mapping *pinned;
	char name[TENSORD_NAME_MAX + 1];
	bool cancelled;
};

int tensord_fd(tensord_client *c)
{
	int r = td_client_current(&c);

	return r < 0 ? r : c->conn.fd;
}

/*
 * Lets go of the abandoned requests that were answered: their leases end,
 * their descriptors close. Lock not held (ending a lease sends).
 */
static void sweep(tensord_client *c)
{
	struct td_pending *gone = NULL, **pp, *p;

	pthread_mutex_lock(&c->lock);
	for (pp = &c->conn.pending; (p = *pp);) {
		if (p->abandoned && (p->done || c->conn.closed)) {
			*pp = p->next;
			p->next = gone;
			gone = p;
		} else {
			pp = &p->next;
		}
	}
	pthread_mutex_unlock(&c->lock);
	while ((p = gone)) {
		gone = p->next;
		if (p->reply && p->reply->body_case == TENSORD__REPLY__BODY_LEASE)
			td_lease_end(c, p->reply->lease->lease);
		set_let_go(c, p);
		free(p);
	}
}

int tensord_poll(tensord_client *c)
{
	int r = td_client_current(&c);

	if (r < 0)
		return r;
	r = td_poll(c);
	sweep(c);
	if (r < 0)
		return td_set_error(r, "%s", c->conn.why[0] ? c->conn.why : tensord_strerror(r));
	return r;
}

static int op_new(tensord_client *c, enum op_kind kind, tensord_op **ret_op)
{
	tensord_op *op = calloc(1, sizeof(*op));

	if (op)
		op->p = calloc(1, sizeof(*op->p));
	if (!op || !op->p) {
		free(op);
		return td_set_error(-ENOMEM, "out of memory");
	}
	op->c = c;
	op->kind = kind;
	op->p->async = true;
	op->p->multi = kind == OP_ATTACH_MANY;
	*ret_op = op;
	return 0;
}

static void op_destroy(tensord_op *op)
{
	if (op->pinned)
		td_mapcache_unref(&op->c->maps, op->pinned);
	free(op->p);
	free(op);
}

int tensord_attach_start(tensord_client *c, const char *name, uint64_t after, int timeout_ms,
			 tensord_op **ret_op)
{
	struct td_attach_req am;
	tensord_op *op;
	int r = td_client_current(&c);

	if (r == 0 && !ret_op)
		r = td_set_error(-EINVAL, "attach: NULL output");
	if (r == 0)
		r = op_new(c, OP_ATTACH, &op);
	if (r < 0)
		return r;
	r = td_attach_msg(c, &am, name, after, timeout_ms);
	if (r == 0) {
		op->pinned = am.pinned;
		snprintf(op->name, sizeof(op->name), "%s", name);
		r = td_rpc_start(c, &am.req, op->p);
	}
	if (r < 0) {
		op_destroy(op);
		return r;
	}
	td_client_ref(c);
	*ret_op = op;
	return 0;
}

int tensord_attach_many_start(tensord_client *c, const char *const *names, size_t n_names,
			      const char *prefix, uint64_t after, int timeout_ms,
			      tensord_op **ret_op)
{
	struct set_req m;
	tensord_op *op;
	int r = td_client_current(&c);

	if (r == 0 && !ret_op)
		r = td_set_error(-EINVAL, "attach_many: NULL output");
	if (r == 0)
		r = set_msg(c, &m, names, n_names, prefix, after, timeout_ms);
	if (r == 0)
		r = op_new(c, OP_ATTACH_MANY, &op);
	if (r < 0)
		return r;
	r = td_rpc_start(c, &m.req, op->p);
	if (r < 0) {
		op_destroy(op);
		return r;
	}
	td_client_ref(c);
	*ret_op = op;
	return 0;
}

bool tensord_op_done(const tensord_op *op)
{
	bool done;

	if (!op)
		return true;
	pthread_mutex_lock(&op->c->lock);
	done = op->p->done || op->c->conn.closed;
	pthread_mutex_unlock(&op->c->lock);
	return done;
}

/* Asks the daemon to answer request id with ECANCELED; its own reply is let go. */
static int send_cancel(tensord_client *c, uint64_t id)
{
	Tensord__Request req = TENSORD__REQUEST__INIT;
	Tensord__Cancel cn = TENSORD__CANCEL__INIT;
	struct td_pending *p = calloc(1, sizeof(*p));
	int r;

	if (!p)
		return td_set_error(-ENOMEM, "out of memory");
	p->abandoned = true;
	cn.id = id;
	req.body_case = TENSORD__REQUEST__BODY_CANCEL;
	req.cancel = &cn;
	r = td_rpc_start(c, &req, p);
	if (r < 0)
		free(p);
	return r;
}

int tensord_op_cancel(tensord_op *op)
{
	if (!op)
		return td_set_error(-EINVAL, "cancel: NULL op");
	if (op->cancelled || tensord_op_done(op))
		return 0;
	op->cancelled = true;
	return send_cancel(op->c, op->p->id);
}

/* The answer of a done op: 0, or its error (set). */
static int op_end(tensord_op *op)
{
	return td_rpc_end(op->c, op->p);
}

int tensord_attach_finish(tensord_op *op, DLManagedTensorVersioned **ret_tensor)
{
	tensord_client *c;
	struct td_lease *l;
	int r;

	if (!op || op->kind != OP_ATTACH || !ret_tensor)
		return td_set_error(-EINVAL, "attach_finish: not an attach operation");
	if (!tensord_op_done(op))
		return td_set_error(-EAGAIN, "attach_finish: not answered yet");
	c = op->c;
	r = op_end(op);
	if (r == 0) {
		r = td_attach_reply(c, op->name, op->p->reply, op->p->fd, op->pinned, &l);
		op->p->reply = NULL;
		op->p->fd = -1;
		op->pinned = NULL;
		if (r == 0)
			r = td_lease_handle(l, ret_tensor);
	}
	td_pending_clear(op->p);
	op_destroy(op);
	td_client_unref(c);
	return r;
}

int tensord_attach_many_finish(tensord_op *op, tensord_set **ret_set)
{
	tensord_client *c;
	int r;

	if (!op || op->kind != OP_ATTACH_MANY || !ret_set)
		return td_set_error(-EINVAL, "attach_many_finish: not an attach_many operation");
	if (!tensord_op_done(op))
		return td_set_error(-EAGAIN, "attach_many_finish: not answered yet");
	c = op->c;
	r = op_end(op);
	if (r == 0) {
		r = set_build(c, op->p, ret_set);
	} else {
		char saved[512];

		snprintf(saved, sizeof(saved), "%s", tensord_last_error());
		set_let_go(c, op->p);
		td_set_error(r, "%s", saved);
	}
	op_destroy(op);
	td_client_unref(c);
	return r;
}

tensord_op *tensord_op_free(tensord_op *op)
{
	tensord_client *c;
	bool done;

	if (!op)
		return NULL;
	c = op->c;
	pthread_mutex_lock(&c->lock);
	done = op->p->done || c->conn.closed;
	/* Unanswered: it stays registered, abandoned, until its answer comes. */
	if (!done)
		op->p->abandoned = true;
	pthread_mutex_unlock(&c->lock);
	if (!done) {
		if (!op->cancelled)
			send_cancel(c, op->p->id);
		op->p = NULL;
	} else {
		op_end(op);
		if (op->p->reply && op->p->reply->body_case == TENSORD__REPLY__BODY_LEASE)
			td_lease_end(c, op->p->reply->lease->lease);
		set_let_go(c, op->p);
	}
	op_destroy(op);
	td_client_unref(c);
	return NULL;
}
