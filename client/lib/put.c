/*
 * libtensord: put(), create + one copy + publish. Host sources may have any
 * strides and are stored row-major compact, written through the memfd's
 * descriptor (never mapped here); GPU sources must be contiguous and are
 * copied device to device by their importer.
 */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "client.h"
#include "common/desc.h"
#include "common/sys.h"

/*
 * Calls emit(ctx, p, n) for each contiguous run of an n-d strided host
 * array, in row-major order, so that the runs laid end to end are its
 * compact copy. Stops at the first negative return and returns it.
 */
static int for_each_run(const uint8_t *src, int ndim, const int64_t *shape, const int64_t *sstrides,
			size_t elsize, int (*emit)(void *ctx, const uint8_t *p, size_t n),
			void *ctx)
{
	int64_t idx[TENSORD_NDIM_MAX] = { 0 };
	size_t inner;
	int d, r;

	if (ndim == 0)
		return emit(ctx, src, elsize);
	for (d = 0; d < ndim; d++)
		if (shape[d] == 0)
			return 0;
	/* Merge trailing dimensions that are already contiguous in src. */
	inner = elsize;
	d = ndim - 1;
	while (d >= 0 && sstrides[d] * (int64_t)elsize == (int64_t)inner) {
		inner *= (size_t)shape[d];
		d--;
	}
	if (d < 0)
		return emit(ctx, src, inner);
	for (;;) {
		const uint8_t *p = src;
		int k;

		for (k = 0; k <= d; k++)
			p += idx[k] * sstrides[k] * (int64_t)elsize;
		r = emit(ctx, p, inner);
		if (r < 0)
			return r;
		for (k = d; k >= 0; k--) {
			if (++idx[k] < shape[k])
				break;
			idx[k] = 0;
		}
		if (k < 0)
			return 0;
	}
}

/*
 * Writes runs into a memfd at increasing offsets with pwrite(): large runs
 * straight from the source, small ones gathered in a buffer first.
 */
struct fd_writer {
	int fd;       /* borrowed */
	uint64_t off; /* where the next byte goes */
	uint8_t *buf; /* owned; NULL when no run was small yet */
	size_t len;   /* bytes gathered in buf */
};

#define GATHER_MAX (1u << 20)
/* Host tensors up to this size travel inside the Put request (frames are 64 KiB). */
#define PUT_INLINE_MAX TD_PUT_INLINE_MAX

static int write_all(struct fd_writer *w, const uint8_t *p, size_t n)
{
	int r = td_pwrite_all(w->fd, p, n, w->off);

	if (r == 0)
		w->off += n;
	return r;
}

static int flush_gathered(struct fd_writer *w)
{
	int r = w->len ? write_all(w, w->buf, w->len) : 0;

	w->len = 0;
	return r;
}

static int write_run(void *ctx, const uint8_t *p, size_t n)
{
	struct fd_writer *w = ctx;
	int r;

	if (n >= GATHER_MAX / 16) {
		r = flush_gathered(w);
		return r < 0 ? r : write_all(w, p, n);
	}
	if (!w->buf && !(w->buf = malloc(GATHER_MAX)))
		return -ENOMEM;
	if (w->len + n > GATHER_MAX && (r = flush_gathered(w)) < 0)
		return r;
	memcpy(w->buf + w->len, p, n);
	w->len += n;
	return 0;
}

/* Where a put goes: a transaction (0: none), and what its publish made. */
struct put_to {
	uint32_t tx;
	tensord_version *version;
	/* A member of a set's GPU allocation (td_put_member()); keep: NULL, none. */
	uint64_t arena_size;
	bool in_arena;
	DLManagedTensorVersioned **keep;
};

/*
 * Whether r says the connection went: the draft went with it, and an
 * unlink to discard it would reach the next daemon, where the name may
 * be the put's own version already (td_write() finds out).
 */
static bool conn_error(int r)
{
	return r == -ECONNRESET || r == -EPIPE || r == -ECONNABORTED || r == -ECONNREFUSED ||
	       r == -ENOTCONN;
}

/*
 * Publishes what put() filled in (when r is 0), or removes the half-made
 * tensor; ends the creator's lease either way. Returns the first error. In
 * a transaction the commit publishes, and the caller aborts on failure.
 */
static int publish_or_discard(tensord_client *c, const char *name, DLManagedTensorVersioned *t,
			      int r, const struct put_to *to)
{
	if (r == 0 && !to->tx)
		r = td_publish(c, name, to->version);
	if (r < 0 && !to->tx && !conn_error(r)) {
		char saved[512];

		snprintf(saved, sizeof(saved), "%s", tensord_last_error());
		td_unlink(c, name);
		td_set_error(r, "%s", saved);
	}
	if (r == 0 && to->keep && !*to->keep)
		*to->keep = t; /* the caller's until its set is written */
	else
		t->deleter(t);
	return r;
}

/* put() of device memory: contiguous sources only, one device-side copy. */
static int put_device(tensord_client *c, const char *name, const DLTensor *src, uint32_t flags,
		      uint32_t mode, size_t elsize, const struct put_to *to)
{
	/* A GPU put recycles its writer's allocations unless sealed
	 * (docs/recycle.md, section 4): a single put's or a transaction
	 * member's of its own, a set's whole (asked by the member that opens
	 * it; the others live in it). */
	bool in_set = to->tx && (to->arena_size || to->in_arena);
	bool recycle = !to->in_arena && !(flags & TENSORD_SEALED);
	tensord_spec spec = { .dtype = src->dtype,
			      .ndim = src->ndim,
			      .shape = src->shape,
			      .device = src->device,
			      .flags = flags | (recycle ? TENSORD_RECYCLE : 0),
			      .mode = mode };
	const struct td_importer *imp;
	DLManagedTensorVersioned *t;
	struct td_mapping *m;
	uint64_t n = elsize;
	int64_t expect = 1;
	int r;

	for (int i = src->ndim - 1; i >= 0; i--) {
		if (src->strides && src->shape[i] > 1 && src->strides[i] != expect)
			return td_set_error(
				-EINVAL,
				"tensor '%s': put copies contiguous device arrays only; "
				"make it contiguous first",
				name);
		expect *= src->shape[i];
		n *= (uint64_t)src->shape[i];
	}
	if (in_set)
		r = td_tx_create_arena(c, to->tx, name, &spec, to->arena_size, to->in_arena, &t);
	else
		r = to->tx ? td_tx_create_raw(c, to->tx, name, &spec, &t)
			   : tensord_create(c, name, &spec, &t);
	if (r < 0)
		return r;
	m = td_tensor_mapping(t);
	imp = m ? td_importer_for(m->handle_kind) : NULL;
	if (n && (!imp || !imp->copy_in))
		r = td_set_error(-ENOTSUP, "tensor '%s': cannot copy into this device's memory",
				 name);
	else if (n)
		r = imp->copy_in(m, (const uint8_t *)src->data + src->byte_offset, n);
	/* A member's copy must be done before the commit seals it. */
	if (r == 0 && to->tx && imp && imp->sync)
		r = imp->sync(m);
	/* Nor does the writer write a member of its own after its copy: its
	 * view goes read-only now, as a single put's at its publish (the
	 * import may stay parked, and a ring's is writable again at the next
	 * version's create). A set's goes at its end (td_put_set_done()). */
	if (r == 0 && to->tx && !in_set && !(flags & TENSORD_MUTABLE) && imp && imp->make_private)
		r = imp->make_private(m);
	return publish_or_discard(c, name, t, r, to);
}

/* Appends runs to a buffer that has room for all of them. */
static int gather_run(void *ctx, const uint8_t *p, size_t n)
{
	uint8_t **dst = ctx;

	memcpy(*dst, p, n);
	*dst += n;
	return 0;
}

/*
 * Small host tensors travel inside the request: one round trip, no
 * descriptor. Returns 1 when the daemon cannot take them so (too large for
 * one request, or a daemon that knows no Put), 0 or -errno otherwise.
 */
static int put_inline(tensord_client *c, const char *name, const DLTensor *src,
		      const tensord_spec *spec, const int64_t *sstrides, size_t elsize,
		      uint64_t nbytes, const struct put_to *to)
{
	uint8_t stack[4096], *buf = stack, *end;
	const uint8_t *bytes = td_put_compact(src);
	int r;

	if (nbytes > PUT_INLINE_MAX)
		return 1;
	if (!bytes) {
		if (nbytes > sizeof(stack) && !(buf = malloc(nbytes)))
			return td_set_error(-ENOMEM, "out of memory");
		end = buf;
		for_each_run((const uint8_t *)src->data + src->byte_offset, src->ndim, src->shape,
			     sstrides, elsize, gather_run, &end);
		bytes = buf;
	}
	r = td_put_rpc(c, name, spec, to->tx, bytes, nbytes, to->version);
	if (buf != stack)
		free(buf);
	return r == -EMSGSIZE || r == -EBADMSG ? 1 : r;
}

static int source_span(const DLTensor *src, size_t elsize, int64_t *lo, int64_t *hi);
static int copy_to_reserve(tensord_client *c, const DLTensor *src, const int64_t *sstrides,
			   size_t elsize, uint8_t *base, uint64_t nbytes);

/*
 * Copies src's bytes into a reserve of this process's (mapped at base)
 * when every byte of the source can be read without a fault; 1 when it
 * cannot tell or some byte cannot be read: then the caller writes them
 * with pwrite(), which turns a bad source into -EFAULT.
 */
int td_put_copy(tensord_client *c, const DLTensor *src, uint8_t *base, uint64_t nbytes)
{
	int64_t cstrides[TENSORD_NDIM_MAX];
	size_t elsize = td_dtype_size(src->dtype);
	uint64_t n = elsize;

	for (int i = src->ndim - 1; i >= 0; i--) {
		cstrides[i] = (int64_t)(n / elsize);
		n *= (uint64_t)src->shape[i];
	}
	return copy_to_reserve(c, src, src->strides ? src->strides : cstrides, elsize, base,
			       nbytes);
}

static int copy_to_reserve(tensord_client *c, const DLTensor *src, const int64_t *sstrides,
			   size_t elsize, uint8_t *base, uint64_t nbytes)
{
	int64_t lo, hi;
	const uint8_t *first = (const uint8_t *)src->data + src->byte_offset;

	if (source_span(src, elsize, &lo, &hi) != 1 ||
	    td_span_readable(first + lo, (uint64_t)(hi - lo)) != 1)
		return 1;
	/* A compact source is one run, which two threads may share. */
	if (td_put_compact(src))
		td_copy(base, first, (size_t)nbytes);
	else
		for_each_run(first, src->ndim, src->shape, sstrides, elsize, gather_run, &base);
	return 0;
}

/*
 * put() of host memory: create, copy the bytes, publish. Into the
 * client's reserve when one of the size is ready (docs/design.md, "The
 * reserve"): memory this process mapped, its page tables filled, before
 * it was asked for, so the copy is one memcpy and the unmap before the
 * seal. Else through the descriptor: pwrite() costs the kernel a
 * page-cache lookup per 4 KiB, where mapping the new memfd here would
 * cost a page-table entry per 4 KiB to set up and, at publish, to tear
 * down again (the creator's view must stop being shared before the
 * daemon seals the memfd).
 */
static int put_host(tensord_client *c, const char *name, const DLTensor *src,
		    const tensord_spec *spec, size_t elsize, const struct put_to *to)
{
	int64_t cstrides[TENSORD_NDIM_MAX];
	const int64_t *sstrides = src->strides ? src->strides : cstrides;
	struct fd_writer w = { .fd = -1 };
	struct td_reserve_slot rs = { .fd = -1 };
	uint64_t lease, nbytes = elsize;
	uint8_t *ring = NULL;
	uint64_t ring_id;
	unsigned mapped;
	bool in_reserve, recycle;
	Tensord__Reply *rep;
	char saved[512];
	int r;

	for (int i = src->ndim - 1; i >= 0; i--) {
		cstrides[i] = (int64_t)(nbytes / elsize);
		/* An overflow goes to the daemon, which refuses the shape. */
		if (src->shape[i] < 0 ||
		    __builtin_mul_overflow(nbytes, (uint64_t)src->shape[i], &nbytes))
			nbytes = UINT64_MAX;
	}
	r = put_inline(c, name, src, spec, sstrides, elsize, nbytes, to);
	if (r <= 0)
		return r;
	recycle = td_ring_begin(c, nbytes, spec->flags, &mapped);
	/* Two buffers of the size mapped: the ring serves a steady writer. */
	in_reserve = mapped < 2 && td_reserve_take(c, nbytes, &rs);
	r = td_create_rpc(c, name, spec, to->tx, rs.id, recycle, &rep, &w.fd);
	if (r < 0) {
		if (in_reserve) {
			td_reserve_slot_free(&rs);
			td_reserve_written(c);
		}
		if (recycle)
			td_ring_end(c);
		return r;
	}
	lease = rep->lease->lease;
	ring_id = rep->lease->ring;
	if (recycle && rep->lease->ring) {
		/* Memory of this writer's ring (docs/recycle.md): a buffer it
		 * maps already, or one new to it that it maps now and keeps. */
		r = td_ring_target(c, rep->lease, &w.fd, in_reserve ? &rs : NULL, name, &ring);
		/* A free buffer served: the reserve stays for a later create. */
		if (rs.base)
			td_reserve_untake(c, &rs);
		in_reserve = false;
	}
	in_reserve = in_reserve && rep->lease->reserve == rs.id && w.fd < 0;
	if (in_reserve) {
		/* The tensor's memfd is the reserve's: write it as mapped. */
		w.fd = rs.fd;
		rs.fd = -1;
	} else if (rs.base) {
		/* The daemon freed it: it did not fit. */
		td_reserve_slot_free(&rs);
		td_reserve_written(c);
	}
	if (rep->lease->handle != TENSORD__HANDLE_KIND__HANDLE_NONE && w.fd < 0 && !ring && r == 0)
		r = td_set_error(-EPROTO, "tensor '%s': tensord sent no descriptor to write", name);
	tensord__reply__free_unpacked(rep, NULL);
	if (r == 0 && ring) {
		r = copy_to_reserve(c, src, sstrides, elsize, ring, nbytes);
		if (r == 0)
			td_ring_written(c, ring_id);
		if (r == 1)
			r = td_set_error(-EFAULT,
					 "tensor '%s': writing its bytes failed: %s (its "
					 "source is not readable memory)",
					 name, strerror(EFAULT));
	} else if (r == 0 && in_reserve &&
		   copy_to_reserve(c, src, sstrides, elsize, rs.base, nbytes) == 0) {
		/* Written. */
	} else if (r == 0 && w.fd >= 0) {
		r = for_each_run((const uint8_t *)src->data + src->byte_offset, src->ndim,
				 src->shape, sstrides, elsize, write_run, &w);
		if (r == 0)
			r = flush_gathered(&w);
		if (r < 0)
			td_set_error(r, "tensor '%s': writing its bytes failed: %s", name,
				     strerror(-r));
	}
	free(w.buf);
	if (w.fd >= 0)
		close(w.fd);
	/* No shared writable mapping may be left when the daemon seals it. */
	if (rs.base) {
		td_reserve_slot_free(&rs);
		td_reserve_written(c);
	}
	if (recycle)
		td_ring_end(c);
	if (r == 0 && !to->tx)
		r = td_publish(c, name, to->version);
	if (r < 0 && !to->tx && !conn_error(r)) {
		snprintf(saved, sizeof(saved), "%s", tensord_last_error());
		td_unlink(c, name);
		td_set_error(r, "%s", saved);
	}
	td_lease_end(c, lease);
	return r;
}

int td_put_write(int fd, const char *name, const DLTensor *src)
{
	size_t elsize = td_dtype_size(src->dtype);
	int64_t cstrides[TENSORD_NDIM_MAX];
	struct fd_writer w = { .fd = fd };
	uint64_t step = 1;
	int r;

	for (int i = src->ndim - 1; i >= 0; i--) {
		cstrides[i] = (int64_t)step;
		step *= (uint64_t)src->shape[i];
	}
	r = for_each_run((const uint8_t *)src->data + src->byte_offset, src->ndim, src->shape,
			 src->strides ? src->strides : cstrides, elsize, write_run, &w);
	if (r == 0)
		r = flush_gathered(&w);
	free(w.buf);
	if (r < 0)
		td_set_error(r, "tensor '%s': writing its bytes failed: %s", name, strerror(-r));
	return r;
}

void td_put_gather(const DLTensor *src, uint8_t *buf)
{
	size_t elsize = td_dtype_size(src->dtype);
	int64_t cstrides[TENSORD_NDIM_MAX];
	uint64_t step = 1;

	for (int i = src->ndim - 1; i >= 0; i--) {
		cstrides[i] = (int64_t)step;
		step *= (uint64_t)src->shape[i];
	}
	for_each_run((const uint8_t *)src->data + src->byte_offset, src->ndim, src->shape,
		     src->strides ? src->strides : cstrides, elsize, gather_run, &buf);
}

const uint8_t *td_put_compact(const DLTensor *src)
{
	int64_t expect = 1;

	for (int i = src->ndim - 1; src->strides && i >= 0; i--) {
		if (src->shape[i] > 1 && src->strides[i] != expect)
			return NULL;
		expect *= src->shape[i];
	}
	return (const uint8_t *)src->data + src->byte_offset;
}

/*
 * The bytes src's elements occupy relative to its first element: [*lo, *hi).
 * false when there are none to read (a zero in the shape), or when the
 * shape is one the daemon will refuse (negative, or too large to
 * allocate), which is then never read either. -EFAULT when the strides
 * reach past either end of the address space.
 */
static int source_span(const DLTensor *src, size_t elsize, int64_t *lo, int64_t *hi)
{
	int64_t step = 1, ext;
	bool compact_ok = true;

	*lo = 0;
	*hi = (int64_t)elsize;
	for (int i = src->ndim - 1; i >= 0; i--) {
		int64_t n = src->shape[i], st = src->strides ? src->strides[i] : step;

		if (n <= 0 || (!src->strides && !compact_ok))
			return 0;
		if (__builtin_mul_overflow(n - 1, st, &ext) ||
		    __builtin_mul_overflow(ext, (int64_t)elsize, &ext) ||
		    __builtin_add_overflow(ext < 0 ? *lo : *hi, ext, ext < 0 ? lo : hi))
			return -EFAULT;
		compact_ok = !__builtin_mul_overflow(step, n, &step);
	}
	return 1;
}

/*
 * Checks, before anything is asked of the daemon, that src's bytes lie
 * where put() may read them. A DLPack producer is foreign code: a NULL
 * data pointer or a byte_offset of 2^40 would crash the caller in the
 * copy, and an address that wraps around would store whatever lies
 * there. -EFAULT, naming the tensor and the reason, when the tensor has
 * elements and its data pointer is NULL; when byte_offset or the strides
 * put an element below address 0 or past the end of the address space;
 * and, for host memory, when a page of the span is not mapped in this
 * process (msync() answers that from the mappings, touching no page, in
 * constant time). A span in mapped but unreadable memory (PROT_NONE)
 * passes: only a copy finds that out.
 */
static int check_source(const char *name, const DLTensor *src, size_t elsize, bool host)
{
	uintptr_t base, below, first, last, page = (uintptr_t)sysconf(_SC_PAGESIZE);
	int64_t lo, hi;
	int r;

	if (src->ndim && !src->shape)
		return td_set_error(-EFAULT,
				    "tensor '%s': the source has %d dimensions but no shape", name,
				    src->ndim);
	r = source_span(src, elsize, &lo, &hi);
	if (r == 0)
		return 0;
	if (r < 0)
		return td_set_error(-EFAULT,
				    "tensor '%s': the source's strides span more than the address "
				    "space",
				    name);
	if (!src->data)
		return td_set_error(-EFAULT,
				    "tensor '%s': the source's data pointer is NULL, but its "
				    "elements span %llu bytes",
				    name, (unsigned long long)((uint64_t)hi - (uint64_t)lo));
	below = (uintptr_t)0 - (uintptr_t)lo; /* lo <= 0: bytes before the first element */
	if (src->byte_offset > INTPTR_MAX ||
	    __builtin_add_overflow((uintptr_t)src->data, (uintptr_t)src->byte_offset, &base) ||
	    below > base || __builtin_add_overflow(base, (uintptr_t)hi, &last))
		return td_set_error(
			-EFAULT,
			"tensor '%s': the source's byte_offset %llu from data pointer %p "
			"runs past the end of the address space",
			name, (unsigned long long)src->byte_offset, src->data);
	first = base - below;
	if (host &&
	    (last > UINTPTR_MAX - page ||
	     msync((void *)(first & ~(page - 1)),
		   ((last + page - 1) & ~(page - 1)) - (first & ~(page - 1)), MS_ASYNC) < 0))
		return td_set_error(-EFAULT,
				    "tensor '%s': the source's %llu bytes at %p (data pointer %p + "
				    "byte_offset %llu) are not mapped in this process",
				    name, (unsigned long long)(last - first), (void *)first,
				    src->data, (unsigned long long)src->byte_offset);
	return 0;
}

int td_put_check(const char *name, const DLTensor *src, uint32_t flags, uint32_t mode,
		 tensord_spec *spec, uint64_t *ret_nbytes)
{
	char why[80];
	size_t elsize;
	uint64_t nbytes;
	int r;

	if (!src)
		return td_set_error(-EINVAL, "tensor '%s': no source", name ? name : "");
	if (td_ndim_check(src->ndim, 0, false, why, sizeof(why)) < 0)
		return td_set_error(-EINVAL, "tensor '%s': %s", name, why);
	elsize = td_dtype_size(src->dtype);
	if (!elsize)
		return td_set_error(-EINVAL, "tensor '%s': put needs a dtype of whole bytes", name);
	if (!td_device_is_gpu(src->device.device_type) &&
	    !td_device_host_accessible(src->device.device_type))
		return td_set_error(-EINVAL, "tensor '%s': put cannot read device type %d", name,
				    (int)src->device.device_type);
	r = check_source(name, src, elsize, !td_device_is_gpu(src->device.device_type));
	if (r < 0)
		return r;
	*spec = (tensord_spec){ .dtype = src->dtype,
				.ndim = src->ndim,
				.shape = src->shape,
				.device = (DLDevice){ kDLCPU, 0 },
				.flags = flags,
				.mode = mode };
	nbytes = elsize;
	for (int i = 0; i < src->ndim; i++)
		if (src->shape[i] < 0 ||
		    __builtin_mul_overflow(nbytes, (uint64_t)src->shape[i], &nbytes))
			nbytes = UINT64_MAX;
	*ret_nbytes = nbytes;
	return 0;
}

int td_put(tensord_client *c, const char *name, const DLTensor *src, uint32_t flags, uint32_t mode,
	   uint32_t tx, tensord_version *ret_version)
{
	struct put_to to = { .tx = tx, .version = ret_version };
	tensord_spec spec;
	uint64_t nbytes;
	int r = td_client_current(&c);

	if (r == 0)
		r = td_put_check(name, src, flags, mode, &spec, &nbytes);
	if (r < 0)
		return r;
	if (td_device_is_gpu(src->device.device_type))
		return put_device(c, name, src, flags, mode, td_dtype_size(src->dtype), &to);
	return put_host(c, name, src, &spec, td_dtype_size(src->dtype), &to);
}

int td_put_member(tensord_client *c, const char *name, const DLTensor *src, uint32_t flags,
		  uint32_t mode, uint32_t tx, uint64_t arena_size, bool in_arena,
		  DLManagedTensorVersioned **keep)
{
	struct put_to to = {
		.tx = tx, .arena_size = arena_size, .in_arena = in_arena, .keep = keep
	};
	tensord_spec spec;
	uint64_t nbytes;
	int r = td_put_check(name, src, flags, mode, &spec, &nbytes);

	if (r < 0)
		return r;
	if (!td_device_is_gpu(src->device.device_type))
		return td_set_error(-EINVAL, "tensor '%s': a set's GPU member on the host", name);
	return put_device(c, name, src, flags, mode, td_dtype_size(src->dtype), &to);
}

int td_put_set_done(DLManagedTensorVersioned *keep, int r)
{
	struct td_mapping *m = td_tensor_mapping(keep);
	const struct td_importer *imp = m ? td_importer_for(m->handle_kind) : NULL;

	/* A GPU ring buffer's import stays parked with its view mapped: that
	 * view read-only now (one cuMemSetAccess), as a single put's publish
	 * leaves it, and read-write again at the next version's create. */
	if (r == 0 && m && m->gpu_ring && imp && imp->make_private)
		r = imp->make_private(m);
	keep->deleter(keep);
	return r;
}

struct put_call {
	const char *name;
	const DLTensor *src;
	uint32_t flags, mode;
	tensord_version *version;
};

static int put_once(tensord_client *c, void *arg)
{
	struct put_call *p = arg;

	return td_put(c, p->name, p->src, p->flags, p->mode, 0, p->version);
}

int tensord_put_version(tensord_client *c, const char *name, const DLTensor *src, uint32_t flags,
			uint32_t mode, tensord_version *ret_version)
{
	struct put_call p = { name, src, flags, mode, ret_version };

	/* A put whose connection is lost is done again from src, never twice (idem.c). */
	return td_write(c, TD_WRITE_PUT, (struct td_what){ name ? name : "(null)", "put" },
			put_once, &p, ret_version, NULL);
}

int tensord_put(tensord_client *c, const char *name, const DLTensor *src, uint32_t flags,
		uint32_t mode)
{
	return tensord_put_version(c, name, src, flags, mode, NULL);
}
