/*
 * A GPU ring buffer's import, kept (docs/recycle.md, section 4;
 * client/lib/import_gpu.h, td_gpu_shared.keep): the process's import of
 * the ring's allocation stays, its views mapped, when its last mapping
 * goes, parked until a later version in the same allocation takes it back
 * or td_gpu_parked_sweep() unparks it. A view of the other access left so
 * is turned (one cuMemSetAccess) rather than mapped anew: the writer's
 * read-write view becomes read-only at its publish and read-write again
 * at the next version's create.
 *
 * Apart from import_cuda.c because it is one case of the VMM import with
 * a lifetime of its own (kept, parked, unparked by the sweep), on the
 * views import_cuda.c keeps for a set's mappings (import_cuda_int.h).
 */
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "client/lib/import_gpu.h"
#include "gpu/cuda/cuda_api.h"
#include "gpu/cuda/import_cuda_int.h"

/*
 * p's new import is a GPU ring buffer's: kept, parked between versions
 * (import_gpu.h), with a reference on the device's primary context so its
 * mapped views outlive every mapping's. Left unkept when either fails.
 */
void td_cuda_keep(struct td_cuda_map *p)
{
	const struct td_cuda_api *cu = p->g.api;
	struct td_gpu_shared *s = p->g.shared;
	struct td_cuda_views *vs = calloc(1, sizeof(*vs));
	CUcontext ctx;

	if (!vs)
		return;
	if (cu->DevicePrimaryCtxRetain(&ctx, p->dev) != CUDA_SUCCESS) {
		free(vs);
		return;
	}
	vs->cu = cu;
	vs->dev = p->dev;
	vs->ctx_held = true;
	s->vendor = vs;
	s->keep = true;
}

/*
 * A kept import (td_cuda_views) whose view of the other access is mapped
 * and unused: it becomes the view of access writable, by one
 * cuMemSetAccess. Lock held, the device's context current. 0 (also when
 * there is none to turn: the caller maps one) or -errno (error set).
 */
int td_cuda_view_turn(struct td_cuda_map *p, struct td_cuda_views *vs, bool writable)
{
	struct td_cuda_view *to = &vs->v[writable ? 1 : 0], *from = &vs->v[writable ? 0 : 1];
	CUresult r;

	if (!from->ptr || from->refs)
		return 0;
	p->g.ptr = from->ptr;
	p->size = from->size;
	p->access = from->access;
	p->peers_refused = from->peers_refused;
	r = td_cuda_set_access(p, writable, false);
	if (r != CUDA_SUCCESS)
		return td_gpu_fail(&td_cuda_client, p->g.api, r,
				   writable ? "cuMemSetAccess (read-write for the next version)"
					    : "cuMemSetAccess (read-only)");
	*to = (struct td_cuda_view){ .ptr = from->ptr,
				     .size = from->size,
				     .access = p->access,
				     .ro_enforced = p->ro_enforced,
				     .peers_refused = p->peers_refused };
	memset(from, 0, sizeof(*from));
	return 0;
}

/*
 * td_cuda_protect() of p, alone in its view of a kept import, to the other
 * access: the view turns (td_cuda_view_turn()) and p keeps it, so the
 * range stays mapped for the next version. Called with the lock held,
 * which it drops.
 */
int td_cuda_protect_kept(struct td_mapping *m, struct td_cuda_map *p, struct td_cuda_views *vs,
			 bool writable)
{
	int err = td_cuda_enter(p->g.api, p->dev, true);

	if (err == 0) {
		vs->v[p->view].refs = 0;
		err = td_cuda_view_turn(p, vs, writable);
		if (err == 0)
			p->view = writable ? 1 : 0;
		vs->v[p->view].refs++;
		td_cuda_leave(p->g.api, p->dev, false);
	}
	td_gpu_shared_unlock();
	m->ro_enforced = p->ro_enforced;
	return err;
}

/* A kept import off the table (import_gpu.h): the device idle, its views unmapped, released. */
void td_cuda_unpark(struct td_gpu_shared *s)
{
	struct td_cuda_views *vs = s->vendor;
	const struct td_cuda_api *cu = vs->cu;
	bool entered = td_cuda_enter(cu, vs->dev, false) == 0;

	/* Kernels reading a view may still be queued (docs/gpu.md, "Unmapping waits"). */
	if (entered)
		(void)cu->CtxSynchronize();
	for (int i = 0; i < 2; i++)
		if (vs->v[i].ptr) {
			cu->MemUnmap(vs->v[i].ptr, vs->v[i].size);
			cu->MemAddressFree(vs->v[i].ptr, vs->v[i].size);
		}
	cu->MemRelease((CUmemGenericAllocationHandle)s->value);
	if (entered)
		td_cuda_leave(cu, vs->dev, false);
	if (vs->ctx_held)
		cu->DevicePrimaryCtxRelease(vs->dev);
}
