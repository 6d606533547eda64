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

struct reg_arena *registry_restore_memory(struct registry *reg, int fd, uint64_t size, uint32_t uid,
					  uint32_t gid, uint32_t mode)
{
	struct reg_device *dev = registry_device(reg, (DLDevice){ kDLCPU, 0 });
	struct reg_arena *a;

	if (!dev || dev->init_rc < 0)
		return NULL;
	a = calloc(1, sizeof(*a));
	if (!a)
		return NULL;
	a->alloc.ops = dev->ops;
	a->alloc.fd = fd;
	a->alloc.size = size;
	a->alloc.footprint = (size + 4095) & ~(uint64_t)4095;
	a->alloc.handle_kind = TENSORD__HANDLE_KIND__HANDLE_MEMFD;
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
	reg->n_arenas++;
	reg->arena_bytes += a->alloc.footprint;
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
	if (reg_find_named(reg, r->name, r->name_len)) {
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

int registry_restore_gpu(struct registry *reg, const struct reg_restore *r, int device_type,
			 const uint8_t uuid[16], int fd, uint64_t size, char *why, size_t why_len)
{
	int64_t strides[TENSORD_NDIM_MAX];
	struct reg_device *dev = NULL;
	struct tensor *t;
	uint64_t nbytes;
	int rc;

	for (int i = 0; i < reg->n_devices && !dev; i++) {
		struct reg_device *d = &reg->devices[i];
		uint8_t u[16];

		if ((int)d->device.device_type == device_type && d->init_rc == 0 &&
		    d->ops->device_uuid && d->ops->device_uuid(d->device.device_id, u) == 0 &&
		    !memcmp(u, uuid, sizeof(u)))
			dev = d;
	}
	if (!dev || !dev->ops->import_fd) {
		snprintf(why, why_len, "%s",
			 !dev ? "its GPU is not here now (by UUID)"
			      : "its backend cannot import memory again");
		close(fd);
		return -ENODEV;
	}
	rc = restore_layout(reg, r, strides, &nbytes, why, why_len);
	if (rc == 0 && nbytes > size) {
		snprintf(why, why_len, "%llu bytes do not fit its allocation of %llu",
			 (unsigned long long)nbytes, (unsigned long long)size);
		rc = -EINVAL;
	}
	t = rc < 0 ? NULL : restore_new(r, strides, dev->device);
	if (rc == 0 && !t) {
		snprintf(why, why_len, "out of memory");
		rc = -ENOMEM;
	}
	if (rc == 0)
		rc = reg_name_room(reg, t, why, why_len);
	if (rc < 0) {
		free(t);
		close(fd);
		return rc;
	}
	rc = dev->ops->import_fd(&t->alloc, fd, size, dev->device.device_id);
	t->alloc.ops = dev->ops;
	if (rc < 0) {
		snprintf(why, why_len, "importing its allocation again: %s", tensord_strerror(rc));
		dev->ops->release(&t->alloc);
		free(t);
		return rc;
	}
	if (reg->quota) {
		quota_add(reg->quota, t->owner_uid, QUOTA_TENSORS, 1);
		quota_add(reg->quota, t->owner_uid, QUOTA_BYTES, t->alloc.footprint);
		quota_add(reg->quota, t->owner_uid, QUOTA_FDS, 1);
	}
	t->bytes_charged = t->alloc.footprint;
	t->fd_charged = true;
	reg_tensor_link(reg, dev, t);
	reg_tensor_name(reg, t);
	return 0;
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
	t = restore_new(r, strides, (DLDevice){ kDLCPU, 0 });
	if (!t) {
		snprintf(why, why_len, "out of memory");
		return -ENOMEM;
	}
	rc = reg_name_room(reg, t, why, why_len);
	if (rc < 0) {
		free(t);
		return rc;
	}
	/* Its slice of a, as reg_arena_place() gives a member its own. */
	t->alloc = a->alloc;
	t->alloc.size = nbytes;
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
	reg_tensor_name(reg, t);
	return 0;
}
