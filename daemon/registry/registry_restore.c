/*
 * Restart (docs/restart.md, section 4): the tensors a predecessor
 * published, put back in the table before the daemon serves.
 *
 * The memory of restored tensors is a descriptor the service manager kept
 * (a memfd of its own, a slab, a ring buffer or a set allocation of the
 * old daemon): one descriptor per piece of memory, however many tensors
 * live in it. Each becomes a set allocation with no writer (struct
 * reg_arena, rc NULL): its members are the restored tensors, each at its
 * offset, and it is freed when the last of them goes, never recycled
 * (nobody maps it writable any more, and nobody could write it back).
 * Readers map it once, by its share id, as they map a slab.
 *
 * Nothing here refuses for quota or capacity: the memory exists already,
 * and a restart must not lose what the previous daemon accepted. It is
 * charged as it was (the owner's tensors and bytes, one descriptor per
 * piece of memory) and may leave a uid over its share until it frees some.
 */
#include <assert.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "common/desc.h"
#include "daemon/base/log.h"
#include "registry.h"
#include "registry_int.h"

/* The device of device_type whose UUID is uuid (a GPU), or the host; NULL: not here. */
static struct reg_device *restore_device(struct registry *reg, int device_type,
					 const uint8_t uuid[16])
{
	if (device_type == kDLCPU)
		return registry_device(reg, (DLDevice){ kDLCPU, 0 });
	for (int i = 0; i < reg->n_devices; i++) {
		struct reg_device *d = &reg->devices[i];
		uint8_t u[16];

		if ((int)d->device.device_type == device_type && d->init_rc == 0 &&
		    d->ops->device_uuid && d->ops->device_uuid(d->device.device_id, u) == 0 &&
		    !memcmp(u, uuid, sizeof(u)))
			return d;
	}
	return NULL;
}

struct reg_arena *registry_restore_memory(struct registry *reg, int device_type,
					  const uint8_t uuid[16], int fd, uint64_t size,
					  uint32_t uid, uint32_t gid, uint32_t mode, char *why,
					  size_t why_len)
{
	struct reg_device *dev = restore_device(reg, device_type, uuid);
	struct reg_arena *a;
	int r;

	if (!dev || dev->init_rc < 0 || (device_type != kDLCPU && !dev->ops->import_fd)) {
		snprintf(why, why_len, "%s",
			 !dev || dev->init_rc < 0 ? "its device is not here now (a GPU by UUID)"
						  : "its backend cannot import memory again");
		close(fd);
		return NULL;
	}
	a = calloc(1, sizeof(*a));
	if (!a) {
		snprintf(why, why_len, "out of memory");
		close(fd);
		return NULL;
	}
	a->alloc.fd = -1;
	if (device_type == kDLCPU) {
		a->alloc.fd = fd;
		a->alloc.size = size;
		a->alloc.footprint = (size + 4095) & ~(uint64_t)4095;
		a->alloc.handle_kind = TENSORD__HANDLE_KIND__HANDLE_MEMFD;
	} else {
		/* A GPU allocation's export: its backend imports it again. */
		r = dev->ops->import_fd(&a->alloc, fd, size, dev->device.device_id);
		a->alloc.ops = dev->ops;
		if (r < 0) {
			snprintf(why, why_len, "importing its allocation again: %s",
				 tensord_strerror(r));
			dev->ops->release(&a->alloc);
			free(a);
			return NULL;
		}
		a->gpu = true;
	}
	a->alloc.ops = dev->ops;
	a->alloc.device_id = dev->device.device_id;
	a->alloc.share_id = REG_RING_SHARE | ++reg->next_ring_share;
	a->dev = dev;
	a->uid = uid;
	a->gid = gid;
	a->mode = mode;
	a->open = true; /* until registry_restore_memory_done() */
	a->spare = a->alloc.footprint;
	a->tainted = true; /* never recycled: it has no writer */
	if (reg->quota) {
		quota_add(reg->quota, uid, QUOTA_BYTES, a->spare);
		quota_add(reg->quota, uid, QUOTA_FDS, 1);
	}
	dev->used += a->spare;
	if (a->gpu) {
		reg->n_gpu_arenas++;
		reg->gpu_arena_bytes += a->alloc.footprint;
	} else {
		reg->n_arenas++;
		reg->arena_bytes += a->alloc.footprint;
	}
	return a;
}

void registry_restore_memory_done(struct registry *reg, struct reg_arena *a)
{
	reg_arena_close(reg, a);
}

/* r's layout checked and its strides in elements: 0 with *ret_nbytes, or -errno and why. */
static int restore_layout(struct registry *reg, const struct reg_restore *r, int64_t *strides,
			  uint64_t *ret_nbytes, char *why, size_t why_len)
{
	char reason[200];
	int rc;

	if (r->ndim < 0 || r->ndim > TENSORD_NDIM_MAX || r->name_len > TENSORD_NAME_MAX) {
		snprintf(why, why_len, "%d dimensions or a name of %zu bytes", (int)r->ndim,
			 r->name_len);
		return -EINVAL;
	}
	rc = td_name_check(r->name, r->name_len, why, why_len);
	if (rc < 0)
		return rc;
	rc = td_layout(r->dtype, r->ndim, r->shape, r->strides, strides, ret_nbytes, reason,
		       sizeof(reason));
	if (rc < 0) {
		snprintf(why, why_len, "%s", reason);
		return rc;
	}
	if (*ret_nbytes != r->nbytes) {
		snprintf(why, why_len, "its layout takes %llu bytes, its record says %llu",
			 (unsigned long long)*ret_nbytes, (unsigned long long)r->nbytes);
		return -EINVAL;
	}
	if (!r->retired && reg_find_named(reg, r->name, r->name_len)) {
		snprintf(why, why_len, "its name is taken already");
		return -EEXIST;
	}
	return 0;
}

/* A published tensor of r's record on device (its memory not yet set), or NULL. */
static struct tensor *restore_new(const struct reg_restore *r, const int64_t *strides,
				  DLDevice device)
{
	struct tensor *t =
		calloc(1, sizeof(*t) + 2 * (size_t)r->ndim * sizeof(int64_t) + r->name_len + 1);

	if (!t)
		return NULL;
	t->shape = t->dims;
	t->strides = t->dims + r->ndim;
	t->name = (char *)(t->dims + 2 * r->ndim);
	memcpy(t->name, r->name, r->name_len);
	t->name[r->name_len] = '\0';
	t->name_len = r->name_len;
	t->dtype = r->dtype;
	t->ndim = r->ndim;
	if (r->ndim) {
		memcpy(t->shape, r->shape, (size_t)r->ndim * sizeof(int64_t));
		memcpy(t->strides, strides, (size_t)r->ndim * sizeof(int64_t));
	}
	t->device = device;
	t->nbytes = r->nbytes;
	t->state = TENSORD_STATE_PUBLISHED;
	t->flags = r->flags & TENSORD_MUTABLE;
	t->mode = r->mode;
	t->owner_uid = r->uid;
	t->owner_gid = r->gid;
	t->created_ns = r->created_ns;
	t->generation = r->generation;
	t->commit = r->commit;
	t->alloc.fd = -1;
	return t;
}

int registry_restore_tensor(struct registry *reg, struct reg_arena *a, const struct reg_restore *r,
			    char *why, size_t why_len)
{
	int64_t strides[TENSORD_NDIM_MAX];
	struct tensor *t;
	uint64_t nbytes;
	int rc = restore_layout(reg, r, strides, &nbytes, why, why_len);

	if (rc < 0)
		return rc;
	if (r->offset > a->alloc.size || nbytes > a->alloc.size - r->offset || nbytes > a->spare) {
		snprintf(why, why_len,
			 "%llu bytes at offset %llu do not fit its memory of %llu bytes "
			 "(%llu left)",
			 (unsigned long long)r->nbytes, (unsigned long long)r->offset,
			 (unsigned long long)a->alloc.size, (unsigned long long)a->spare);
		return -EINVAL;
	}
	t = restore_new(r, strides, a->dev->device);
	if (!t) {
		snprintf(why, why_len, "out of memory");
		return -ENOMEM;
	}
	rc = r->retired ? 0 : reg_name_room(reg, t, why, why_len);
	if (rc < 0) {
		free(t);
		return rc;
	}
	/* Its slice of a, as reg_arena_place() gives a member its own (on a
	 * GPU its lease maps the whole allocation). */
	t->alloc = a->alloc;
	t->alloc.size = a->gpu ? a->alloc.size : nbytes;
	t->alloc.footprint = nbytes;
	t->alloc.ipc_offset = r->offset;
	t->arena = a;
	a->members++;
	a->spare -= nbytes;
	if (reg->quota) {
		quota_uncharge(reg->quota, a->uid, QUOTA_BYTES, nbytes);
		quota_add(reg->quota, t->owner_uid, QUOTA_TENSORS, 1);
		quota_add(reg->quota, t->owner_uid, QUOTA_BYTES, nbytes);
	}
	a->dev->used -= nbytes; /* reg_tensor_link() counts it as t's */
	t->bytes_charged = nbytes;
	reg_tensor_link(reg, a->dev, t);
	if (r->retired) {
		/* Under no name: only its holders' re-adoption reaches it. */
		reg_figures(reg, t, TENSORD_STATE_PUBLISHED, TENSORD_STATE_UNLINKED, 0);
		t->state = TENSORD_STATE_UNLINKED;
		t->retired_logged = true;
	} else {
		reg_tensor_name(reg, t);
	}
	registry_readopt_hold(reg, t);
	return 0;
}
