/*
 * libtensord: transactions and put_many (docs/design.md, "Versions, sets
 * and watches"). A transaction is a client-side id: its members are
 * created and put with it, its commit is one request. put_many is one
 * transaction of puts, pipelined in windows, so n tensors cost a few round
 * trips instead of 2n.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "client.h"
#include "common/desc.h"
#include "common/sys.h"

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

/* The commit, once, not retried (put_many's own: it does the whole set again). */
static int tx_commit(tensord_tx *tx, uint64_t *ret_commit)
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
		/* Its members live in tx->c's connection: never a successor's. */
		r = td_rpc_on(tx->c, &req, &rep, NULL);
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

struct commit_call {
	tensord_tx *tx;
	uint64_t *commit;
};

static int commit_once(tensord_client *c, void *arg)
{
	struct commit_call *k = arg;

	return tx_commit(k->tx, k->commit);
}

int tensord_tx_commit(tensord_tx *tx, uint64_t *ret_commit)
{
	struct commit_call k = { tx, ret_commit };
	char what[64];
	int r = tx_usable(tx);

	if (r < 0)
		return r;
	/* Its members died with a lost connection: applied, or lost (idem.c). */
	snprintf(what, sizeof(what), "transaction %u: commit", tx->id);
	return td_write(tx->c, TD_WRITE_DRAFT, (struct td_what){ NULL, what }, commit_once, &k,
			NULL, ret_commit);
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
	bool recycle;   /* asked for a ring buffer: td_ring_end() once answered */
	bool arena;     /* a member of the set allocation (the set ends its ring turn) */
	uint8_t *buf;   /* owned: the inline bytes, until the request is sent */
	size_t cost;    /* the request's bytes on the wire */
	const tensord_put_item *item;
};

/*
 * The copies into ring buffers put_many keeps for one job at the end
 * (td_copy_many(): the copy pool wakes once for the set, not per member),
 * with the creator leases and ring turns (td_ring_end()) they hold until
 * then. Compact, readable sources only; room for every item.
 */
struct deferred {
	struct td_copy_part *parts;
	uint64_t *leases;
	uint64_t *rings;
	bool *ends; /* its own ring turn to end (not a set allocation's member) */
	size_t n;
};

/* Copies what was deferred (unless r says the set failed), then ends what it held. */
static int deferred_run(tensord_client *c, struct deferred *dv, int r)
{
	if (r == 0 && dv->n)
		td_copy_many(dv->parts, dv->n);
	for (size_t i = 0; i < dv->n; i++) {
		if (r == 0)
			td_ring_written(c, dv->rings[i]);
		td_lease_end(c, dv->leases[i]);
		if (dv->ends[i])
			td_ring_end(c);
	}
	dv->n = 0;
	return r;
}

/*
 * The answer to one slot: the put's status, or the create's lease written
 * and ended; or, into a ring buffer, the copy deferred to dv (NULL: none).
 */
static int put_finish(tensord_client *c, struct put_slot *s, int r, struct deferred *dv)
{
	bool deferred = false;
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
			uint8_t *ring = NULL;

			w = s->p.reply->lease;
			/* Memory of this writer's ring (docs/recycle.md): copied into
			 * its mapping; else written through the descriptor. */
			if ((s->recycle || s->arena) && w->ring)
				r = td_ring_target(c, w, &s->p.fd, NULL, s->item->name, &ring);
			if (r < 0) {
				/* The error is set. */
			} else if (ring) {
				const uint8_t *src = td_put_compact(s->item->src);

				if (dv && src && w->map_size &&
				    td_span_readable(src, w->map_size) == 1) {
					dv->parts[dv->n] =
						(struct td_copy_part){ ring, src,
								       (size_t)w->map_size };
					dv->rings[dv->n] = w->ring;
					dv->ends[dv->n] = s->recycle;
					dv->leases[dv->n++] = w->lease;
					deferred = true;
				} else {
					r = td_put_copy(c, s->item->src, ring, w->map_size);
					if (r == 0)
						td_ring_written(c, w->ring);
				}
				if (r == 1)
					r = td_set_error(
						-EFAULT,
						"tensor '%s': writing its bytes failed: %s "
						"(its source is not readable memory)",
						s->item->name, strerror(EFAULT));
			} else if (w->handle != TENSORD__HANDLE_KIND__HANDLE_NONE && s->p.fd < 0) {
				r = td_set_error(-EPROTO, "tensor '%s': no descriptor to write",
						 s->item->name);
			} else if (s->p.fd >= 0) {
				r = td_put_write(s->p.fd, s->item->name, s->item->src);
			}
			if (!deferred)
				td_lease_end(c, w->lease);
		}
	}
	td_pending_clear(&s->p);
	free(s->buf);
	s->buf = NULL;
	if (s->recycle && !deferred)
		td_ring_end(c);
	s->recycle = false;
	return r;
}

/*
 * A set in one allocation (docs/recycle.md, section 5): the members a
 * put_many lays out in one ring buffer, and its size. Each member that
 * would take a ring buffer of its own (host, past the inline size) goes
 * at the next offset, aligned as the daemon places them (registry_arena.c):
 * to a page when it is a page or more, else to 256 bytes. Nothing for
 * fewer than two such members.
 */
enum { ARENA_NONE, ARENA_OPENS, ARENA_MEMBER, ARENA_GPU_OPENS, ARENA_GPU_MEMBER };

/* Where a member of nbytes goes after fill bytes: as registry_arena.c places it. */
static uint64_t arena_next(uint64_t fill, uint64_t nbytes)
{
	uint64_t align = nbytes >= 4096 ? 4096 : 256;

	return ((fill + align - 1) & ~(align - 1)) + nbytes;
}

/* src's bytes, or 0 when it has none or a size past 64 bits. */
static uint64_t item_bytes(const DLTensor *src)
{
	uint64_t nbytes;

	if (!src || src->ndim < 0 || (src->ndim && !src->shape))
		return 0;
	nbytes = td_dtype_size(src->dtype);
	for (int d = 0; d < src->ndim; d++)
		if (src->shape[d] < 0 ||
		    __builtin_mul_overflow(nbytes, (uint64_t)src->shape[d], &nbytes))
			return 0;
	return nbytes;
}

/*
 * The same for GPU members (docs/recycle.md, section 5): the compact
 * device arrays of the first GPU member's device go into one allocation
 * of the daemon's (rounded there to the driver's granularity), so a
 * reader imports the set once. Their roles go into role; the size, or 0
 * for fewer than two (or a mutable set, which the daemon keeps per
 * member).
 */
static uint64_t gpu_arena_plan(const tensord_put_item *items, size_t n, uint32_t flags,
			       uint8_t *role)
{
	const DLTensor *first = NULL;
	uint64_t fill = 0;
	size_t members = 0;

	for (size_t i = 0; i < n && !(flags & TENSORD_MUTABLE); i++) {
		const DLTensor *src = items[i].src;
		uint64_t nbytes = item_bytes(src), expect = 1;
		bool compact = true;

		if (!nbytes || !td_device_is_gpu(src->device.device_type))
			continue;
		if (!first)
			first = src;
		if (src->device.device_type != first->device.device_type ||
		    src->device.device_id != first->device.device_id)
			continue;
		for (int d = src->ndim - 1; d >= 0 && compact; d--) {
			compact = !src->strides || src->shape[d] <= 1 ||
				  src->strides[d] == (int64_t)expect;
			expect *= (uint64_t)src->shape[d];
		}
		if (!compact)
			continue;
		fill = arena_next(fill, nbytes);
		role[i] = members++ ? ARENA_GPU_MEMBER : ARENA_GPU_OPENS;
	}
	if (members < 2) {
		for (size_t i = 0; i < n; i++)
			if (role[i] >= ARENA_GPU_OPENS)
				role[i] = ARENA_NONE;
		return 0;
	}
	return fill;
}

static uint64_t arena_plan(const tensord_put_item *items, size_t n, uint8_t *role)
{
	uint64_t fill = 0, page = 4096;
	size_t members = 0;

	for (size_t i = 0; i < n; i++) {
		const DLTensor *src = items[i].src;
		uint64_t nbytes, align;
		bool over = false;

		role[i] = ARENA_NONE;
		if (!src || td_device_is_gpu(src->device.device_type) || src->ndim < 0 ||
		    (src->ndim && !src->shape))
			continue;
		/* Its size only: put_prepare() checks the source, once. */
		nbytes = td_dtype_size(src->dtype);
		for (int d = 0; d < src->ndim && !over; d++)
			over = src->shape[d] < 0 ||
			       __builtin_mul_overflow(nbytes, (uint64_t)src->shape[d], &nbytes);
		if (over || nbytes <= TD_PUT_INLINE_MAX)
			continue;
		align = nbytes >= page ? page : 256;
		fill = ((fill + align - 1) & ~(align - 1)) + nbytes;
		role[i] = members++ ? ARENA_MEMBER : ARENA_OPENS;
	}
	return members >= 2 ? (fill + page - 1) & ~(page - 1) : 0;
}

/*
 * Readies item's request in s: inline bytes when they fit, else a create
 * (of a member of the set allocation of arena_size bytes when role says).
 */
static int put_prepare(tensord_client *c, uint32_t tx, struct put_slot *s,
		       const tensord_put_item *item, uint32_t flags, uint32_t mode, uint8_t role,
		       uint64_t arena_size)
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
	if (r == 0 && !s->inline_bytes && role != ARENA_NONE) {
		/* The set's ring turn covers it. */
		s->arena = true;
		r = td_create_msg(&s->m.create, item->name, &spec, tx, true);
		s->m.create.m.cr.arena_size = role == ARENA_OPENS ? arena_size : 0;
		s->m.create.m.cr.in_arena = role == ARENA_MEMBER;
	} else if (r == 0 && !s->inline_bytes) {
		s->recycle = td_ring_begin(c, nbytes, flags, NULL);
		r = td_create_msg(&s->m.create, item->name, &spec, tx, s->recycle);
		if (r < 0 && s->recycle) {
			td_ring_end(c);
			s->recycle = false;
		}
	}
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

static int put_many_once(tensord_client *c, const tensord_put_item *items, size_t n, uint32_t flags,
			 uint32_t mode, uint64_t *ret_commit)
{
	struct deferred dv = { 0 };
	struct put_slot *slots, *s;
	size_t oldest = 0, next = 0, bytes = 0;
	uint64_t arena_size = 0, gpu_arena = 0;
	DLManagedTensorVersioned *gpu_keep = NULL; /* holds the set's GPU import (put.c) */
	uint8_t *role = NULL;
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
	/* Without room to defer, each member is copied as its answer comes. */
	dv.parts = n ? malloc(n * sizeof(*dv.parts)) : NULL;
	dv.leases = n ? malloc(n * sizeof(*dv.leases)) : NULL;
	dv.rings = n ? malloc(n * sizeof(*dv.rings)) : NULL;
	dv.ends = n ? malloc(n * sizeof(*dv.ends)) : NULL;
	if (!dv.parts || !dv.leases || !dv.rings || !dv.ends) {
		free(dv.parts);
		free(dv.leases);
		free(dv.rings);
		free(dv.ends);
		dv = (struct deferred){ 0 };
	}
	/* Its members in one ring buffer when they can be (one turn of the ring for the set). */
	role = n ? calloc(n, 1) : NULL;
	if (role && dv.parts)
		arena_size = arena_plan(items, n, role);
	if (arena_size && !td_ring_begin(c, arena_size, flags, NULL))
		arena_size = 0;
	if (!arena_size && role)
		memset(role, ARENA_NONE, n);
	/* Its GPU members in one device allocation when they can be. */
	if (role)
		gpu_arena = gpu_arena_plan(items, n, flags, role);
	r = tensord_tx_begin(c, &tx);
	while (oldest < next || (r == 0 && next < n)) {
		if (r == 0 && next < n && next - oldest < PUT_WINDOW) {
			s = &slots[next % PUT_WINDOW];
			if (!ready) {
				r = put_prepare(c, tx->id, s, &items[next], flags, mode,
						role ? role[next] : ARENA_NONE, arena_size);
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
			uint8_t ro = role ? role[oldest] : ARENA_NONE;

			if (r == 0 && ro >= ARENA_GPU_OPENS)
				r = td_put_member(c, s->item->name, s->item->src, flags, mode,
						  tx->id, ro == ARENA_GPU_OPENS ? gpu_arena : 0,
						  ro == ARENA_GPU_MEMBER, &gpu_keep);
			else if (r == 0)
				r = td_put(c, s->item->name, s->item->src, flags, mode, tx->id,
					   NULL);
		} else {
			int ri;

			td_rpc_wait(c, &s->p);
			ri = put_finish(c, s, r, dv.parts ? &dv : NULL);
			r = r < 0 ? r : ri;
		}
		bytes -= s->cost;
		oldest++;
	}
	if (ready) {
		/* Readied, then an answer failed: never sent. */
		free(slots[next % PUT_WINDOW].buf);
		if (slots[next % PUT_WINDOW].recycle)
			td_ring_end(c);
	}
	/* The set's GPU members are written: this process's import of them goes
	 * with its last mapping (the daemon's allocation stays theirs), or
	 * parks read-only when the allocation recycles. */
	if (gpu_keep)
		r = td_put_set_done(gpu_keep, r);
	/* Every member's bytes before the commit publishes them. */
	r = deferred_run(c, &dv, r);
	free(dv.parts);
	free(dv.leases);
	free(dv.rings);
	free(dv.ends);
	free(role);
	if (arena_size)
		td_ring_end(c);
	if (r == 0)
		r = tx_commit(tx, ret_commit);
	else if (tx)
		tx_fail(tx);
	tensord_tx_free(tx);
	free(slots);
	return r;
}

struct put_many_call {
	const tensord_put_item *items;
	size_t n;
	uint32_t flags, mode;
	uint64_t *commit;
};

static int put_many_call(tensord_client *c, void *arg)
{
	struct put_many_call *p = arg;

	return put_many_once(c, p->items, p->n, p->flags, p->mode, p->commit);
}

int tensord_put_many(tensord_client *c, const tensord_put_item *items, size_t n, uint32_t flags,
		     uint32_t mode, uint64_t *ret_commit)
{
	struct put_many_call p = { items, n, flags, mode, ret_commit };
	char what[64];

	/* A set whose connection is lost is put again whole, never twice (idem.c). */
	snprintf(what, sizeof(what), "put_many of %zu tensors", n);
	return td_write(c, TD_WRITE_PUT, (struct td_what){ NULL, what }, put_many_call, &p, NULL,
			ret_commit);
}
