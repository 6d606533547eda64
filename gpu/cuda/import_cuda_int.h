/*
 * What import_cuda.c (the CUDA importers) and import_park.c (a GPU ring
 * buffer's import, kept and parked between versions) share; private to
 * the CUDA importers, part of libtensord only.
 */
#ifndef TENSORD_GPU_CUDA_IMPORT_CUDA_INT_H
#define TENSORD_GPU_CUDA_IMPORT_CUDA_INT_H

#include <stdbool.h>
#include <stdint.h>

#include "client/lib/import_gpu.h"
#include "gpu/cuda/cuda_api.h"

/* The importer's state for one mapping; m->priv. g.ptr: VMM's reserved range, or the opened pointer. */
struct td_cuda_map {
	struct td_gpu_map g;
	CUdevice dev;
	size_t size; /* VMM: bytes reserved and mapped */
	bool vmm;
	bool ro_enforced;   /* VMM read-only mapping honoured by the driver */
	bool peers_refused; /* VMM: the driver refused access for the peers; the owner alone has it */
	/*
	 * VMM: this process's devices given access to the range (bit i:
	 * ordinal i), the owner's and those of its peers that can reach it.
	 * Every later change of access covers the same set.
	 */
	uint64_t access;
	/*
	 * VMM, a member of a set in one allocation (td_import_desc.share_id):
	 * g.ptr is not this mapping's own range but the view of the import
	 * that every mapping of the set with the same access shares
	 * (struct td_cuda_views, view 0 read-only, 1 read-write).
	 */
	bool borrowed;
	int view;
};

/*
 * The ranges a set's mappings share (td_gpu_shared.vendor), under the
 * import table's lock: one reserved, mapped and given access once for
 * every read-only mapping of the set in this process, and one for the
 * writable ones (its writer's, while it fills the members), so a reader
 * of 300 members makes one cuMemAddressReserve, one cuMemMap and one
 * cuMemSetAccess, not 300. A view goes with the last mapping using it.
 */
struct td_cuda_views {
	struct td_cuda_view {
		uint64_t ptr; /* 0: none */
		size_t size;
		uint64_t access;
		bool ro_enforced, peers_refused;
		unsigned refs; /* mappings using it */
	} v[2];
	/*
	 * A GPU ring buffer's import (td_gpu_shared.keep): its views stay
	 * mapped when their last mapping goes, and a view of the other access
	 * left so is given the access asked (one cuMemSetAccess) rather than a
	 * range of its own: the writer's read-write view of version g becomes
	 * read-only at its publish and read-write again at the create of the
	 * next version into the same allocation. The import holds a reference
	 * on dev's primary context (ctx_held) for as long as it is kept.
	 */
	const struct td_cuda_api *cu;
	CUdevice dev;
	bool ctx_held;
};

_Static_assert(TD_GPU_MAX_DEVICES <= 64, "a device's bit in td_cuda_map.access");

/* import_cuda.c: the primary context, and a VMM range's access (contracts at the definitions). */
int td_cuda_enter(const struct td_cuda_api *cu, CUdevice dev, bool report);
void td_cuda_leave(const struct td_cuda_api *cu, CUdevice dev, bool keep_ref);
CUresult td_cuda_set_access(struct td_cuda_map *p, bool writable, bool narrow);

/* import_park.c: a GPU ring buffer's import, kept and parked (contracts at the definitions). */
void td_cuda_keep(struct td_cuda_map *p);
int td_cuda_view_turn(struct td_cuda_map *p, struct td_cuda_views *vs, bool writable);
int td_cuda_protect_kept(struct td_mapping *m, struct td_cuda_map *p, struct td_cuda_views *vs,
			 bool writable);
void td_cuda_unpark(struct td_gpu_shared *s);

#endif
