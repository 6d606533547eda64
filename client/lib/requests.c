/*
 * libtensord: the requests. Each public call checks its arguments, builds
 * one Request, makes one round trip (td_rpc) and turns the reply into
 * public records, or into a lease (lease.c) for create and attach.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "client.h"
#include "common/desc.h"
#include "proto/frame.h"

static int check_name(const char *name)
{
	char why[300];

	if (!name)
		return td_set_error(-EINVAL, "name is NULL");
	if (td_name_check(name, strlen(name), why, sizeof(why)) < 0)
		return td_set_error(-EINVAL, "%s", why);
	return 0;
}

/* An attach may also name another node's tensor, "@PEER/NAME" (docs/remote.md, "Naming"). */
static int check_attach_name(const char *name)
{
	char why[300];
	size_t peer_len;

	if (!name || name[0] != '@')
		return check_name(name);
	if (td_remote_name_check(name, strlen(name), &peer_len, why, sizeof(why)) < 0)
		return td_set_error(-EINVAL, "%s", why);
	return 0;
}

/*
 * The lease in the reply to a create or attach (op) of name.
 * Takes ownership of rep and fd (-1 when none): freed and closed on every
 * path. Takes ownership of the reference on pinned (NULL when none), as
 * td_lease_from_reply() does. On success *ret_lease is the caller's; hand
 * it to td_lease_handle() or td_lease_handle_legacy().
 */
static int lease_reply(tensord_client *c, const char *name, const char *op, Tensord__Reply *rep,
		       int fd, struct td_mapping *pinned, bool created, struct td_lease **ret_lease)
{
	int r;

	if (rep->body_case != TENSORD__REPLY__BODY_LEASE) {
		tensord__reply__free_unpacked(rep, NULL);
		if (fd >= 0)
			close(fd);
		if (pinned)
			td_mapcache_unref(&c->maps, pinned);
		return td_set_error(-EPROTO, "tensor '%s': tensord answered %s without a lease",
				    name, op);
	}
	r = td_lease_from_reply(c, rep->lease, fd, pinned, created, ret_lease);
	tensord__reply__free_unpacked(rep, NULL);
	return r;
}

/*
 * A GPU travels as its UUID (the daemon numbers its GPUs its own way);
 * the ordinal goes along for messages and for HIP devices without UUIDs.
 */
static int create_msg_device(struct create_msg *m, const char *name, DLDevice dev)
{
	char why[400];
	int r;

	m->dev.type = (uint32_t)dev.device_type;
	m->dev.id = dev.device_id;
	if (!td_device_is_gpu(dev.device_type))
		return 0;
	r = td_gpu_device_uuid(dev, m->uuid);
	if (r == -ENOENT)
		return 0;
	if (r < 0) {
		snprintf(why, sizeof(why), "%s", tensord_last_error());
		return td_set_error(r, "tensor '%s': %s", name, why);
	}
	m->dev.uuid.data = m->uuid;
	m->dev.uuid.len = sizeof(m->uuid);
	return 0;
}

/* Checks name and spec and fills m from them (borrowed: valid while they are). */
static int create_msg_fill(struct create_msg *m, const char *name, const tensord_spec *spec)
{
	char why[80];
	int r = check_name(name);

	if (r < 0)
		return r;
	if (!spec || (spec->ndim > 0 && !spec->shape))
		return td_set_error(-EINVAL, "tensor '%s': bad spec (ndim %d)", name,
				    spec ? spec->ndim : -1);
	if (td_ndim_check(spec->ndim, 0, false, why, sizeof(why)) < 0)
		return td_set_error(-EINVAL, "tensor '%s': bad spec: %s", name, why);
	tensord__create__init(&m->cr);
	tensord__dtype__init(&m->dt);
	tensord__device__init(&m->dev);
	m->dt.code = spec->dtype.code;
	m->dt.bits = spec->dtype.bits;
	m->dt.lanes = spec->dtype.lanes;
	r = create_msg_device(m, name, spec->device);
	if (r < 0)
		return r;
	m->cr.name = (char *)name;
	m->cr.dtype = &m->dt;
	m->cr.n_shape = (size_t)spec->ndim;
	m->cr.shape = (int64_t *)spec->shape;
	m->cr.n_strides = spec->strides ? (size_t)spec->ndim : 0;
	m->cr.strides = (int64_t *)spec->strides;
	m->cr.device = &m->dev;
	m->cr.flags = spec->flags & ~(uint32_t)(TENSORD_REPLACE | TENSORD_SEALED | TENSORD_RECYCLE);
	m->cr.replace = (spec->flags & TENSORD_REPLACE) != 0;
	m->cr.mode = spec->mode;
	return 0;
}

/* td_create_rpc(), with a set's allocation to open (arena_size) or go into (in_arena). */
static int create_rpc(tensord_client *c, const char *name, const tensord_spec *spec, uint32_t tx,
		      uint64_t reserve, bool recycle, uint64_t arena_size, bool in_arena,
		      Tensord__Reply **ret_reply, int *ret_fd)
{
	Tensord__Request req = TENSORD__REQUEST__INIT;
	struct create_msg m;
	Tensord__Reply *rep;
	int fd, r;

	r = create_msg_fill(&m, name, spec);
	if (r < 0)
		return r;
	m.cr.tx = tx;
	m.cr.reserve = reserve;
	m.cr.recycle = recycle;
	m.cr.arena_size = arena_size;
	m.cr.in_arena = in_arena;
	req.body_case = TENSORD__REQUEST__BODY_CREATE;
	req.create = &m.cr;
	r = td_rpc(c, &req, &rep, &fd);
	if (r < 0)
		return r;
	if (rep->body_case != TENSORD__REPLY__BODY_LEASE || !rep->lease->info) {
		tensord__reply__free_unpacked(rep, NULL);
		if (fd >= 0)
			close(fd);
		return td_set_error(-EPROTO, "tensor '%s': tensord answered create without a lease",
				    name);
	}
	*ret_reply = rep;
	*ret_fd = fd;
	return 0;
}

int td_create_rpc(tensord_client *c, const char *name, const tensord_spec *spec, uint32_t tx,
		  uint64_t reserve, bool recycle, Tensord__Reply **ret_reply, int *ret_fd)
{
	return create_rpc(c, name, spec, tx, reserve, recycle, 0, false, ret_reply, ret_fd);
}

int td_put_msg(struct td_put_msg *pm, const char *name, const tensord_spec *spec, uint32_t tx,
	       const void *data, size_t len, uint32_t max)
{
	int r = create_msg_fill(&pm->m, name, spec);

	if (r < 0)
		return r;
	tensord__request__init(&pm->req);
	tensord__put__init(&pm->put);
	pm->m.cr.tx = tx;
	pm->put.create = &pm->m.cr;
	pm->put.data.data = (uint8_t *)data;
	pm->put.data.len = len;
	pm->req.body_case = TENSORD__REQUEST__BODY_PUT;
	pm->req.put = &pm->put;
	if (tensord__request__get_packed_size(&pm->req) > max)
		return td_set_error(-EMSGSIZE, "tensor '%s': %zu bytes do not fit in one request",
				    name, len);
	return 0;
}

int td_create_msg(struct td_create_req *cm, const char *name, const tensord_spec *spec, uint32_t tx,
		  bool recycle)
{
	int r = create_msg_fill(&cm->m, name, spec);

	if (r < 0)
		return r;
	tensord__request__init(&cm->req);
	cm->m.cr.tx = tx;
	cm->m.cr.recycle = recycle;
	cm->req.body_case = TENSORD__REQUEST__BODY_CREATE;
	cm->req.create = &cm->m.cr;
	return 0;
}

void td_version_from_reply(const Tensord__Reply *rep, tensord_version *ret)
{
	if (!ret)
		return;
	*ret = (tensord_version){ 0 };
	if (rep->body_case == TENSORD__REPLY__BODY_PUBLISHED)
		*ret = (tensord_version){ rep->published->generation, rep->published->commit };
}

int td_put_rpc(tensord_client *c, const char *name, const tensord_spec *spec, uint32_t tx,
	       const void *data, size_t len, tensord_version *ret_version)
{
	struct td_put_msg pm;
	Tensord__Reply *rep;
	int r;

	r = td_put_msg(&pm, name, spec, tx, data, len, c->conn.max_request);
	if (r < 0)
		return r;
	r = td_rpc(c, &pm.req, &rep, NULL);
	if (r == 0) {
		td_version_from_reply(rep, ret_version);
		tensord__reply__free_unpacked(rep, NULL);
	}
	return r;
}

/* The bytes of a host tensor of spec (0 when spec is no valid host spec: the daemon says why). */
static uint64_t host_nbytes(const tensord_spec *spec)
{
	int64_t strides[TENSORD_NDIM_MAX];
	uint64_t nbytes;
	char why[8];

	/* td_layout() checks the rank before it reads the shape. */
	if (!spec || spec->device.device_type != kDLCPU || (spec->ndim > 0 && !spec->shape) ||
	    td_layout(spec->dtype, spec->ndim, spec->shape, spec->strides, strides, &nbytes, why,
		      sizeof(why)) < 0)
		return 0;
	return nbytes;
}

/*
 * The lease of a recycled create whose reply rep (with descriptor fd, or
 * named reserve rs) put it in a ring buffer: its view is that buffer's
 * mapping, lent (docs/recycle.md). Frees rep and fd, ends the create's
 * td_ring_begin(); on failure also the half-made tensor (nobody could
 * fill it).
 */
static int lease_in_ring(tensord_client *c, const char *name, Tensord__Reply *rep, int fd,
			 struct td_reserve_slot *rs, struct td_lease **ret_lease)
{
	uint8_t *ring;
	uint64_t len;
	int r;

	r = td_ring_lend(c, rep->lease, &fd, rs, name, &ring, &len);
	/* A free buffer served: the reserve stays for a later create. */
	if (rs && rs->base)
		td_reserve_untake(c, rs);
	if (r == 0) {
		r = td_lease_from_ring(c, rep->lease, ring, len, ret_lease);
		if (r < 0)
			td_ring_unpin(c, rep->lease->ring);
	}
	td_ring_end(c);
	if (fd >= 0)
		close(fd);
	tensord__reply__free_unpacked(rep, NULL);
	if (r < 0) {
		char saved[512];

		snprintf(saved, sizeof(saved), "%s", tensord_last_error());
		td_unlink(c, name);
		td_set_error(r, "%s", saved);
	}
	return r;
}

int tensord_create(tensord_client *c, const char *name, const tensord_spec *spec,
		   DLManagedTensorVersioned **ret_tensor)
{
	struct td_reserve_slot rs = { .fd = -1 };
	Tensord__Reply *rep;
	struct td_lease *l;
	bool reserved, recycle = false, gpu_ring;
	unsigned mapped = 0;
	uint64_t nbytes;
	int fd, r;

	r = td_client_current(&c);
	if (r < 0)
		return r;
	nbytes = host_nbytes(spec);
	/* Recycled memory, asked for (docs/recycle.md): a buffer of this
	 * writer's ring, mapped already. */
	if (spec && (spec->flags & TENSORD_RECYCLE) && nbytes)
		recycle =
			td_ring_begin(c, nbytes, spec->flags & ~(uint32_t)TENSORD_RECYCLE, &mapped);
	/* A large host tensor goes where this process mapped memory ahead. */
	reserved = mapped < 2 && td_reserve_take(c, nbytes, &rs);
	gpu_ring = td_ring_gpu(c, spec);
	r = td_create_rpc(c, name, spec, 0, rs.id, recycle || gpu_ring, &rep, &fd);
	if (r < 0) {
		if (reserved) {
			td_reserve_slot_free(&rs);
			td_reserve_written(c);
		}
		if (recycle)
			td_ring_end(c);
		return r;
	}
	if (recycle && rep->lease->ring) {
		r = lease_in_ring(c, name, rep, fd, reserved ? &rs : NULL, &l);
		return r < 0 ? r : td_lease_handle(l, ret_tensor);
	}
	if (gpu_ring && rep->lease->ring)
		td_ring_gpu_used(c, rep->lease->ring, rep->lease->map_size);
	if (recycle)
		td_ring_end(c);
	if (reserved && rep->lease->reserve == rs.id && fd < 0) {
		r = td_lease_from_reserve(c, rep->lease, &rs, &l);
		tensord__reply__free_unpacked(rep, NULL);
		td_reserve_slot_free(&rs);
		/* Its publish says when the filling is done (tensord_publish()). */
		if (r == 0)
			td_lease_mapping(l)->filling = true;
		else
			td_reserve_written(c);
	} else {
		/* The daemon freed the reserve: it did not fit. */
		if (reserved) {
			td_reserve_slot_free(&rs);
			td_reserve_written(c);
		}
		r = lease_reply(c, name, "create", rep, fd, NULL, true, &l);
	}
	if (r < 0)
		return r;
	return td_lease_handle(l, ret_tensor);
}

int td_tx_create_raw(tensord_client *c, uint32_t tx, const char *name, const tensord_spec *spec,
		     DLManagedTensorVersioned **ret_tensor)
{
	uint64_t nbytes = host_nbytes(spec);
	Tensord__Reply *rep;
	struct td_lease *l;
	bool recycle = false, gpu_ring;
	int fd, r;

	if (spec && (spec->flags & TENSORD_RECYCLE) && nbytes)
		recycle = td_ring_begin(c, nbytes, spec->flags & ~(uint32_t)TENSORD_RECYCLE, NULL);
	/* A GPU member's allocation of its own recycles as a single put's. */
	gpu_ring = td_ring_gpu(c, spec);
	r = td_create_rpc(c, name, spec, tx, 0, recycle || gpu_ring, &rep, &fd);
	if (r < 0 && recycle)
		td_ring_end(c);
	if (r < 0)
		return r;
	if (recycle && rep->lease->ring) {
		/* A failed member is dropped with its transaction by the caller. */
		r = lease_in_ring(c, name, rep, fd, NULL, &l);
		return r < 0 ? r : td_lease_handle(l, ret_tensor);
	}
	if (gpu_ring && rep->lease->ring)
		td_ring_gpu_used(c, rep->lease->ring, rep->lease->map_size);
	if (recycle)
		td_ring_end(c);
	r = td_lease_from_reply(c, rep->lease, fd, NULL, true, &l);
	tensord__reply__free_unpacked(rep, NULL);
	if (r < 0)
		return r;
	return td_lease_handle(l, ret_tensor);
}

int td_tx_create_arena(tensord_client *c, uint32_t tx, const char *name, const tensord_spec *spec,
		       uint64_t arena_size, bool in_arena, DLManagedTensorVersioned **ret_tensor)
{
	/* The set's allocation recycles (docs/recycle.md, section 0, "GPU
	 * rings"): its opening asks, as a single GPU put does. */
	bool gpu_ring = arena_size && td_ring_gpu(c, spec);
	Tensord__Reply *rep;
	struct td_lease *l;
	int fd, r;

	r = create_rpc(c, name, spec, tx, 0, gpu_ring, arena_size, in_arena, &rep, &fd);
	if (r < 0)
		return r;
	/* A GPU ring buffer its writer gives back when idle (ring.c). */
	if (gpu_ring && rep->lease->ring)
		td_ring_gpu_used(c, rep->lease->ring, rep->lease->map_size);
	r = td_lease_from_reply(c, rep->lease, fd, NULL, true, &l);
	tensord__reply__free_unpacked(rep, NULL);
	if (r < 0)
		return r;
	return td_lease_handle(l, ret_tensor);
}

int td_attach_msg(tensord_client *c, struct td_attach_req *am, const char *name, uint64_t after,
		  int timeout_ms)
{
	int r = check_attach_name(name);

	if (r < 0)
		return r;
	tensord__request__init(&am->req);
	tensord__attach__init(&am->at);
	/* Held across the round trip so that the daemon's "reused" stays true. */
	am->pinned = td_mapcache_find_reusable(&c->maps, name);
	am->at.name = (char *)name;
	am->at.timeout_ms = timeout_ms;
	am->at.after = after;
	am->at.have_id = am->pinned ? am->pinned->id : 0;
	am->at.n_have_shares = td_mapcache_share_ids(&c->maps, am->have_shares, TD_SHARES_MAX);
	am->at.have_shares = am->have_shares;
	am->req.body_case = TENSORD__REQUEST__BODY_ATTACH;
	am->req.attach = &am->at;
	return 0;
}

int td_attach_reply(tensord_client *c, const char *name, Tensord__Reply *rep, int fd,
		    struct td_mapping *pinned, struct td_lease **ret_lease)
{
	return lease_reply(c, name, "attach", rep, fd, pinned, false, ret_lease);
}

/*
 * An attach: served from a binding when this process has one for name (no
 * round trip), else a round trip that asks for one. On success *ret_lease
 * is the caller's, as from lease_reply().
 */
static int attach_lease(tensord_client *c, const char *name, uint64_t after, int timeout_ms,
			const struct td_retry *rt, struct td_lease **ret_lease)
{
	struct td_attach_req am;
	Tensord__Reply *rep;
	uint32_t slot = 0;
	uint64_t gen = 0;
	int fd, r;

	r = after == 0 ? td_client_current_bound(&c) : td_client_current(&c);
	if (r == 0)
		r = check_attach_name(name);
	if (r < 0)
		return r;
	after = td_after_for(c, rt, after);
	if (after == 0) {
		r = td_binding_attach(c, name, ret_lease);
		if (r != 0)
			return r < 0 ? r : 0;
	}
	r = td_attach_msg(c, &am, name, after, timeout_ms);
	if (r < 0)
		return r;
	am.at.bind = td_bindings_ready(c);
	r = td_rpc(c, &am.req, &rep, &fd);
	if (r < 0) {
		if (am.pinned)
			td_mapcache_unref(&c->maps, am.pinned);
		return r;
	}
	if (rep->body_case == TENSORD__REPLY__BODY_LEASE) {
		slot = rep->lease->bind_slot;
		gen = rep->lease->bind_gen;
	}
	r = lease_reply(c, name, "attach", rep, fd, am.pinned, false, ret_lease);
	if (r == 0 && slot)
		td_binding_adopt(c, *ret_lease, slot, gen);
	return r;
}

int tensord_attach(tensord_client *c, const char *name, int timeout_ms,
		   DLManagedTensorVersioned **ret_tensor)
{
	return tensord_attach_after(c, name, 0, timeout_ms, ret_tensor);
}

int tensord_attach_after(tensord_client *c, const char *name, uint64_t after, int timeout_ms,
			 DLManagedTensorVersioned **ret_tensor)
{
	struct td_retry rt;
	struct td_lease *l;
	int r;

	td_retry_begin(&rt, c, timeout_ms);
	do
		r = attach_lease(c, name, after, timeout_ms, &rt, &l);
	while (r < 0 && td_retry_again(&rt, r, &timeout_ms));
	if (r < 0)
		return r;
	return td_lease_handle(l, ret_tensor);
}

int tensord_attach_legacy(tensord_client *c, const char *name, int timeout_ms,
			  DLManagedTensor **ret_tensor)
{
	struct td_lease *l;
	int r = attach_lease(c, name, 0, timeout_ms, NULL, &l);

	if (r < 0)
		return r;
	return td_lease_handle_legacy(l, ret_tensor);
}

/* A round trip whose reply carries nothing but its status. req is borrowed. */
static int simple_rpc(tensord_client *c, Tensord__Request *req)
{
	Tensord__Reply *rep;
	int r = td_rpc(c, req, &rep, NULL);

	if (r == 0)
		tensord__reply__free_unpacked(rep, NULL);
	return r;
}

static int prepare_own_view(tensord_client *c, const char *name, struct td_mapping **ret_mine,
			    const struct td_importer **ret_imp);

int td_own_view_prepare(tensord_client *c, const char *name, struct td_own_view *v)
{
	return prepare_own_view(c, name, &v->mine, &v->imp);
}

void td_own_view_done(tensord_client *c, struct td_own_view *v, bool published)
{
	if (!v->mine)
		return;
	if (!published && v->imp && v->imp->make_shared)
		v->imp->make_shared(v->mine);
	else if (published && !(v->mine->flags & TENSORD_MUTABLE))
		/* New handles on the creator's lease say read-only now. */
		td_mapcache_mark_published(&c->maps, v->mine, v->imp != NULL);
	td_mapcache_unref(&c->maps, v->mine);
	v->mine = NULL;
}

/*
 * Readies the creator's own view of name for its publish (see
 * tensord_publish): waits for queued GPU writes, then, for an immutable
 * tensor, makes the view private. On success *ret_mine is a new reference
 * or NULL (no view of ours); release with td_mapcache_unref(). *ret_imp is
 * the importer whose make_private ran, or NULL.
 */
static int prepare_own_view(tensord_client *c, const char *name, struct td_mapping **ret_mine,
			    const struct td_importer **ret_imp)
{
	struct td_mapping *mine = td_mapcache_find_created(&c->maps, name);
	const struct td_importer *imp;
	int r;

	*ret_mine = NULL;
	*ret_imp = NULL;
	if (!mine)
		return 0;
	imp = td_importer_for(mine->handle_kind);
	/* GPU writes still queued on a stream must land first. */
	if (imp && imp->sync) {
		r = imp->sync(mine);
		if (r < 0) {
			td_mapcache_unref(&c->maps, mine);
			return r;
		}
	}
	if (!(mine->flags & TENSORD_MUTABLE) && imp && imp->make_private) {
		r = imp->make_private(mine);
		if (r < 0) {
			td_mapcache_unref(&c->maps, mine);
			return r;
		}
		*ret_imp = imp;
		/* A ring buffer's view, now read-only (import.c): its ring makes
		 * it writable for the next version. */
		if (mine->lent)
			td_ring_revoked(c, mine->ring_id);
	}
	*ret_mine = mine;
	return 0;
}

int tensord_publish(tensord_client *c, const char *name)
{
	return tensord_publish_version(c, name, NULL);
}

int td_publish(tensord_client *c, const char *name, tensord_version *ret_version)
{
	Tensord__Request req = TENSORD__REQUEST__INIT;
	Tensord__Publish pub = TENSORD__PUBLISH__INIT;
	const struct td_importer *imp;
	struct td_mapping *mine;
	Tensord__Reply *rep;
	int r;

	r = check_name(name);
	if (r < 0)
		return r;
	/*
	 * An immutable tensor's bytes must never change once published, not
	 * even through views its creator made before: our own shared writable
	 * mapping becomes a private one at the same address (so those views
	 * stay valid and later writes stay private), and then the daemon seals
	 * the memory, which the kernel refuses if any shared writer remains.
	 */
	r = prepare_own_view(c, name, &mine, &imp);
	if (r < 0)
		return r;
	pub.name = (char *)name;
	req.body_case = TENSORD__REQUEST__BODY_PUBLISH;
	req.publish = &pub;
	r = td_rpc_on(c, &req, &rep, NULL);
	if (r == 0) {
		td_version_from_reply(rep, ret_version);
		tensord__reply__free_unpacked(rep, NULL);
	}
	if (mine && mine->filling) {
		/* Filled: the reserve thread may make the next one. */
		mine->filling = false;
		td_reserve_written(c);
	}
	if (mine) {
		if (r < 0 && imp && imp->make_shared)
			imp->make_shared(mine);
		else if (r == 0 && !(mine->flags & TENSORD_MUTABLE))
			/* New handles on the creator's lease say read-only now. A
			 * ring buffer's view is no attach's either. */
			td_mapcache_mark_published(&c->maps, mine, imp != NULL || mine->lent);
		td_mapcache_unref(&c->maps, mine);
	}
	return r;
}

struct write_call {
	const char *name;
	tensord_version *version;
};

static int publish_once(tensord_client *c, void *arg)
{
	struct write_call *w = arg;

	int r;

	/* The connection the draft was made on: lost, the draft went with it
	 * (a new connection's publish would name another); else the one that
	 * serves (a forked child's own: the parent's draft is not its). */
	if (tensord_lost(c))
		return td_publish(td_client_latest(c), w->name, w->version);
	r = td_client_current(&c);
	return r < 0 ? r : td_publish(c, w->name, w->version);
}

int tensord_publish_version(tensord_client *c, const char *name, tensord_version *ret_version)
{
	struct write_call w = { name, ret_version };

	return td_write(c, TD_WRITE_DRAFT, (struct td_what){ name ? name : "(null)", "publish" },
			publish_once, &w, ret_version, NULL);
}

int td_unlink(tensord_client *c, const char *name)
{
	Tensord__Request req = TENSORD__REQUEST__INIT;
	Tensord__Unlink ul = TENSORD__UNLINK__INIT;
	int r = check_name(name);

	if (r < 0)
		return r;
	ul.name = (char *)name;
	req.body_case = TENSORD__REQUEST__BODY_UNLINK;
	req.unlink = &ul;
	return simple_rpc(c, &req);
}

static int unlink_once(tensord_client *c, void *arg)
{
	return td_unlink(c, ((struct write_call *)arg)->name);
}

int tensord_unlink(tensord_client *c, const char *name)
{
	struct write_call w = { name, NULL };

	return td_write(c, TD_WRITE_UNLINK, (struct td_what){ name ? name : "(null)", "unlink" },
			unlink_once, &w, NULL, NULL);
}

struct stat_call {
	const char *name;
	tensord_info *ret;
};

static int stat_once(tensord_client *c, void *arg)
{
	Tensord__Request req = TENSORD__REQUEST__INIT;
	Tensord__Stat st = TENSORD__STAT__INIT;
	struct stat_call *a = arg;
	Tensord__Reply *rep;
	int r;

	st.name = (char *)a->name;
	req.body_case = TENSORD__REQUEST__BODY_STAT;
	req.stat = &st;
	r = td_rpc(c, &req, &rep, NULL);
	if (r < 0)
		return r;
	if (rep->body_case != TENSORD__REPLY__BODY_INFO)
		r = td_set_error(-EPROTO, "tensor '%s': tensord answered stat without a tensor",
				 a->name);
	else
		td_info_from_wire(a->ret, rep->info);
	tensord__reply__free_unpacked(rep, NULL);
	return r;
}

int tensord_stat(tensord_client *c, const char *name, tensord_info *ret_info)
{
	struct stat_call a = { name, ret_info };
	int r = check_name(name);

	return r < 0 ? r : td_read(c, stat_once, &a);
}

/*
 * One page of a list: appends its tensors to *v (*n of *cap used, grown as
 * needed) and leaves the last name in after. 1 when more follow, 0 at the
 * end, or -errno.
 */
static int list_page(tensord_client *c, const char *prefix, char *after, tensord_info **v,
		     size_t *n, size_t *cap)
{
	Tensord__Request req = TENSORD__REQUEST__INIT;
	Tensord__List ls = TENSORD__LIST__INIT;
	Tensord__Reply *rep;
	Tensord__ListReply *lr;
	int r;

	ls.prefix = (char *)prefix;
	ls.after = after;
	req.body_case = TENSORD__REQUEST__BODY_LIST;
	req.list = &ls;
	r = td_rpc(c, &req, &rep, NULL);
	if (r < 0)
		return r;
	if (rep->body_case != TENSORD__REPLY__BODY_LIST) {
		tensord__reply__free_unpacked(rep, NULL);
		return td_set_error(-EPROTO, "tensord answered list without a list");
	}
	lr = rep->list;
	if (*n + lr->n_tensors > *cap) {
		size_t ncap = *cap * 2 > *n + lr->n_tensors ? *cap * 2 : *n + lr->n_tensors;
		tensord_info *nv = realloc(*v, ncap * sizeof(*nv));

		if (!nv) {
			tensord__reply__free_unpacked(rep, NULL);
			return td_set_error(-ENOMEM, "out of memory for %zu tensors", ncap);
		}
		*v = nv;
		*cap = ncap;
	}
	for (size_t i = 0; i < lr->n_tensors; i++)
		td_info_from_wire(&(*v)[(*n)++], lr->tensors[i]);
	/* The daemon says where to go on: after the last name it looked at,
	 * which may be one it did not show. */
	r = lr->more && lr->next[0] && strcmp(lr->next, after) > 0 ? 1 : 0;
	if (r)
		snprintf(after, TENSORD_NAME_MAX + 1, "%s", lr->next);
	tensord__reply__free_unpacked(rep, NULL);
	return r;
}

struct list_call {
	const char *prefix;
	tensord_info **ret_infos;
	size_t *ret_count;
};

/* Every page, from the first: a list is one daemon's, also across a restart. */
static int list_all(tensord_client *c, void *arg)
{
	char after[TENSORD_NAME_MAX + 1] = "";
	struct list_call *a = arg;
	tensord_info *v = NULL;
	size_t n = 0, cap = 0;
	int r;

	/* The daemon answers in pages (a reply never holds the whole
	 * registry); the caller sees one list. Names created meanwhile after
	 * the page being read show up, those before it do not. */
	do
		r = list_page(c, a->prefix ? a->prefix : "", after, &v, &n, &cap);
	while (r > 0);
	if (r < 0) {
		free(v);
		return r;
	}
	if (!v && !(v = malloc(sizeof(*v))))
		return td_set_error(-ENOMEM, "out of memory");
	*a->ret_infos = v;
	*a->ret_count = n;
	return 0;
}

int tensord_list(tensord_client *c, const char *prefix, tensord_info **ret_infos, size_t *ret_count)
{
	struct list_call a = { prefix, ret_infos, ret_count };

	return td_read(c, list_all, &a);
}
