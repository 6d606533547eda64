/*
 * Writing .npy files: a version 1.0 header numpy would write byte for
 * byte, then the elements in row-major order whatever the tensor's
 * strides, gathered through a staging buffer.
 */
#include "npy.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

/* The size of the staging buffer npy_write() gathers strided elements in. */
#define NPY_STAGE 65536

int npy_format_header(DLDataType dt, int32_t ndim, const int64_t *shape, bool fortran_order,
		      char *buf, size_t len, char *err, size_t errlen)
{
	char descr[16];
	size_t n, pad;
	int32_t i;
	int rc, w;

	rc = npy_descr_format(dt, descr, sizeof(descr), err, errlen);
	if (rc < 0)
		return rc;
	if (ndim < 0 || ndim > TENSORD_NDIM_MAX)
		return npy_fail(-EINVAL, err, errlen, "%d dimensions (limit %d)", ndim,
				TENSORD_NDIM_MAX);
	if (len < 10)
		return npy_fail(-ENOSPC, err, errlen, "header buffer too small");

	/* Same text numpy writes, so files compare equal byte for byte. */
	n = 10;
	w = snprintf(buf + n, len - n, "{'descr': '%s', 'fortran_order': %s, 'shape': (", descr,
		     fortran_order ? "True" : "False");
	for (i = 0; w >= 0 && (size_t)w < len - n && i < ndim; i++) {
		if (shape[i] < 0)
			return npy_fail(-EINVAL, err, errlen, "negative dimension %lld",
					(long long)shape[i]);
		n += (size_t)w;
		w = snprintf(buf + n, len - n, "%s%lld", i ? ", " : "", (long long)shape[i]);
	}
	if (w >= 0 && (size_t)w < len - n) {
		n += (size_t)w;
		w = snprintf(buf + n, len - n, "%s), }", ndim == 1 ? "," : "");
	}
	if (w < 0 || (size_t)w >= len - n)
		return npy_fail(-ENOSPC, err, errlen, "header buffer too small");
	n += (size_t)w;

	pad = (NPY_ALIGN - (n + 1) % NPY_ALIGN) % NPY_ALIGN;
	if (n + pad + 1 > len || n + pad + 1 - 10 > 0xffff)
		return npy_fail(-ENOSPC, err, errlen, "header buffer too small");
	memset(buf + n, ' ', pad);
	n += pad;
	buf[n++] = '\n';

	memcpy(buf, NPY_MAGIC, NPY_MAGIC_LEN);
	buf[6] = 1;
	buf[7] = 0;
	buf[8] = (char)((n - 10) & 0xff);
	buf[9] = (char)((n - 10) >> 8);
	return (int)n;
}

/* Gathers small runs into one buffer so a transposed tensor is not one fwrite per element. */
struct stage {
	FILE *f;
	size_t used;
	char buf[NPY_STAGE];
};

static int stage_flush(struct stage *s)
{
	if (s->used && fwrite(s->buf, 1, s->used, s->f) != s->used)
		return -EIO;
	s->used = 0;
	return 0;
}

static int stage_put(struct stage *s, const char *p, size_t n)
{
	if (n > NPY_STAGE - s->used) {
		if (stage_flush(s) < 0)
			return -EIO;
		if (n >= NPY_STAGE)
			return fwrite(p, 1, n, s->f) == n ? 0 : -EIO;
	}
	memcpy(s->buf + s->used, p, n);
	s->used += n;
	return 0;
}

int npy_write_elements(FILE *f, const DLTensor *t, char *err, size_t errlen)
{
	int64_t strides[TENSORD_NDIM_MAX], idx[TENSORD_NDIM_MAX];
	size_t itemsize = (size_t)t->dtype.bits * t->dtype.lanes / 8;
	int64_t off, block;
	const char *base;
	struct stage *s;
	int32_t d, k;
	int rc;

	for (d = t->ndim - 1, off = 1; d >= 0; d--) {
		strides[d] = t->strides ? t->strides[d] : off;
		off *= t->shape[d];
	}
	/*
	 * Fold the innermost dimensions that are laid out row-major compact
	 * into one block copied with a single memcpy; iterate over the rest.
	 * Dimensions of size 1 fold whatever their stride says.
	 */
	block = 1;
	for (k = t->ndim; k > 0; k--) {
		if (t->shape[k - 1] != 1 && strides[k - 1] != block)
			break;
		block *= t->shape[k - 1];
	}

	s = malloc(sizeof(*s)); /* freed below; too big for a comfortable stack frame */
	if (!s)
		return npy_fail(-ENOMEM, err, errlen, "out of memory");
	s->f = f;
	s->used = 0;
	base = (const char *)t->data + t->byte_offset;
	memset(idx, 0, sizeof(idx));
	off = 0;
	rc = 0;
	for (;;) {
		rc = stage_put(s, base + off * (int64_t)itemsize, (size_t)block * itemsize);
		if (rc < 0)
			break;
		for (d = k - 1; d >= 0; d--) {
			off += strides[d];
			if (++idx[d] < t->shape[d])
				break;
			off -= strides[d] * t->shape[d];
			idx[d] = 0;
		}
		if (d < 0)
			break;
	}
	if (rc == 0)
		rc = stage_flush(s);
	free(s);
	if (rc < 0)
		return npy_fail(-EIO, err, errlen, "write error: %s", strerror(errno));
	return 0;
}

int npy_write(FILE *f, const DLTensor *t, char *err, size_t errlen)
{
	char hdr[4096];
	uint64_t count = 1;
	int32_t d;
	int n;

	if (!tensord_device_host_accessible(t->device.device_type))
		return npy_fail(-ENOTSUP, err, errlen,
				"tensor is in device memory (type %d); "
				"only host memory can be written",
				(int)t->device.device_type);
	if (t->ndim < 0 || t->ndim > TENSORD_NDIM_MAX)
		return npy_fail(-EINVAL, err, errlen, "%d dimensions (limit %d)", t->ndim,
				TENSORD_NDIM_MAX);
	n = npy_format_header(t->dtype, t->ndim, t->shape, false, hdr, sizeof(hdr), err, errlen);
	if (n < 0)
		return n;
	for (d = 0; d < t->ndim; d++)
		count *= (uint64_t)t->shape[d];
	if (count && !t->data)
		return npy_fail(-EINVAL, err, errlen, "tensor has no data pointer");

	if (fwrite(hdr, 1, (size_t)n, f) != (size_t)n)
		return npy_fail(-EIO, err, errlen, "write error: %s", strerror(errno));
	if (count == 0)
		return 0;
	return npy_write_elements(f, t, err, errlen);
}
