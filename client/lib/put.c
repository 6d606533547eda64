/*
 * libtensord: put(), create + one copy + publish. Host sources may have any
 * strides and are stored row-major compact; GPU sources must be contiguous
 * and are copied device to device by their importer.
 */
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "client.h"
#include "common/desc.h"

/* Copies an n-d strided host array into a compact one, innermost run at a time. */
static void copy_strided(uint8_t *dst, const uint8_t *src, int ndim, const int64_t *shape,
			 const int64_t *sstrides, size_t elsize)
{
	int64_t idx[TENSORD_NDIM_MAX] = { 0 };
	size_t inner;
	int d;

	if (ndim == 0) {
		memcpy(dst, src, elsize);
		return;
	}
	for (d = 0; d < ndim; d++)
		if (shape[d] == 0)
			return;
	/* Merge trailing dimensions that are already contiguous in src. */
	inner = elsize;
	d = ndim - 1;
	while (d >= 0 && sstrides[d] * (int64_t)elsize == (int64_t)inner) {
		inner *= (size_t)shape[d];
		d--;
	}
	if (d < 0) {
		memcpy(dst, src, inner);
		return;
	}
	for (;;) {
		const uint8_t *p = src;

		for (int k = 0; k <= d; k++)
			p += idx[k] * sstrides[k] * (int64_t)elsize;
		memcpy(dst, p, inner);
		dst += inner;
		int k = d;
		for (; k >= 0; k--) {
			if (++idx[k] < shape[k])
				break;
			idx[k] = 0;
		}
		if (k < 0)
			return;
	}
}

/*
 * Publishes what put() filled in (when r is 0), or removes the half-made
 * tensor; ends the creator's lease either way. Returns the first error.
 */
static int publish_or_discard(tensord_client *c, const char *name, DLManagedTensorVersioned *t,
			      int r)
{
	if (r == 0)
		r = tensord_publish(c, name);
	if (r < 0) {
		char saved[512];

		snprintf(saved, sizeof(saved), "%s", tensord_last_error());
		tensord_unlink(c, name);
		td_set_error(r, "%s", saved);
	}
	t->deleter(t);
	return r;
}

/* put() of device memory: contiguous sources only, one device-side copy. */
static int put_device(tensord_client *c, const char *name, const DLTensor *src, uint32_t flags,
		      uint32_t mode, size_t elsize)
{
	tensord_spec spec = { .dtype = src->dtype, .ndim = src->ndim, .shape = src->shape,
			      .device = src->device, .flags = flags, .mode = mode };
	const struct td_importer *imp;
	DLManagedTensorVersioned *t;
	struct td_mapping *m;
	uint64_t n = elsize;
	int64_t expect = 1;
	int r;

	for (int i = src->ndim - 1; i >= 0; i--) {
		if (src->strides && src->shape[i] > 1 && src->strides[i] != expect)
			return td_set_error(-EINVAL,
					    "tensor '%s': put copies contiguous device arrays only; "
					    "make it contiguous first", name);
		expect *= src->shape[i];
		n *= (uint64_t)src->shape[i];
	}
	r = tensord_create(c, name, &spec, &t);
	if (r < 0)
		return r;
	m = td_tensor_mapping(t);
	imp = m ? td_importer_for(m->handle_kind) : NULL;
	if (n && (!imp || !imp->copy_in))
		r = td_set_error(-ENOTSUP, "tensor '%s': cannot copy into this device's memory", name);
	else if (n)
		r = imp->copy_in(m, (const uint8_t *)src->data + src->byte_offset, n);
	return publish_or_discard(c, name, t, r);
}

int tensord_put(tensord_client *c, const char *name, const DLTensor *src, uint32_t flags,
		uint32_t mode)
{
	tensord_spec spec = { 0 };
	DLManagedTensorVersioned *t;
	int64_t cstrides[TENSORD_NDIM_MAX];
	size_t elsize;
	int r;

	if (!src)
		return td_set_error(-EINVAL, "tensor '%s': no source", name ? name : "");
	if (src->ndim < 0 || src->ndim > TENSORD_NDIM_MAX)
		return td_set_error(-EINVAL, "tensor '%s': %d dimensions", name, src->ndim);
	elsize = td_dtype_size(src->dtype);
	if (!elsize)
		return td_set_error(-EINVAL, "tensor '%s': put needs a dtype of whole bytes", name);
	if (td_device_is_gpu(src->device.device_type))
		return put_device(c, name, src, flags, mode, elsize);
	if (!td_device_host_accessible(src->device.device_type))
		return td_set_error(-EINVAL, "tensor '%s': put cannot read device type %d", name,
				    (int)src->device.device_type);
	spec.dtype = src->dtype;
	spec.ndim = src->ndim;
	spec.shape = src->shape;
	spec.device = (DLDevice){ kDLCPU, 0 };
	spec.flags = flags;
	spec.mode = mode;
	r = tensord_create(c, name, &spec, &t);
	if (r < 0)
		return r;
	if (!src->strides) {
		int64_t acc = 1;

		for (int i = src->ndim - 1; i >= 0; i--) {
			cstrides[i] = acc;
			acc *= src->shape[i];
		}
	}
	copy_strided(t->dl_tensor.data, (const uint8_t *)src->data + src->byte_offset, src->ndim,
		     src->shape, src->strides ? src->strides : cstrides, elsize);
	return publish_or_discard(c, name, t, 0);
}
