/*
 * NumPy .npy reader and writer for tensorctl. See npy.h for what is handled.
 *
 * The format (numpy/lib/format.py documents it): six magic bytes, a major
 * and a minor version byte, a little-endian header length (u16 in 1.0, u32
 * in 2.0 and 3.0), then the header text, a Python dict literal such as
 * {'descr': '<f4', 'fortran_order': False, 'shape': (3, 4), } padded with
 * spaces and a newline, then the raw elements. 3.0 only differs from 2.0 in
 * allowing UTF-8 in the header, which only structured dtypes use.
 */
#include "common/desc.h"
#include "npy.h"

#include <errno.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>

/* The byte order this host writes; the other one is refused on read. */
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
#define NPY_NATIVE '>'
#else
#define NPY_NATIVE '<'
#endif

/* The size of the staging buffer npy_write() gathers strided elements in. */
#define NPY_STAGE 65536

static int npy_fail(int rc, char *err, size_t errlen, const char *fmt, ...)
	__attribute__((format(printf, 4, 5)));

static int npy_fail(int rc, char *err, size_t errlen, const char *fmt, ...)
{
	va_list ap;

	if (err && errlen) {
		va_start(ap, fmt);
		vsnprintf(err, errlen, fmt, ap);
		va_end(ap);
	}
	return rc;
}

/* The numpy spellings of the dtypes we carry, and their DLPack codes. */
static const struct {
	char kind;
	uint8_t size;
	uint8_t code;
	const char *name;
} npy_types[] = {
	{ 'b', 1, kDLBool, "bool" },
	{ 'i', 1, kDLInt, "int8" },
	{ 'i', 2, kDLInt, "int16" },
	{ 'i', 4, kDLInt, "int32" },
	{ 'i', 8, kDLInt, "int64" },
	{ 'u', 1, kDLUInt, "uint8" },
	{ 'u', 2, kDLUInt, "uint16" },
	{ 'u', 4, kDLUInt, "uint32" },
	{ 'u', 8, kDLUInt, "uint64" },
	{ 'f', 2, kDLFloat, "float16" },
	{ 'f', 4, kDLFloat, "float32" },
	{ 'f', 8, kDLFloat, "float64" },
	{ 'c', 8, kDLComplex, "complex64" },
	{ 'c', 16, kDLComplex, "complex128" },
};

#define N_TYPES (sizeof(npy_types) / sizeof(npy_types[0]))

const char *npy_dtype_str(DLDataType dt, char *buf, size_t len)
{
	size_t i;

	if (dt.lanes == 1) {
		for (i = 0; i < N_TYPES; i++) {
			if (npy_types[i].code == dt.code && npy_types[i].size * 8 == dt.bits) {
				snprintf(buf, len, "%s", npy_types[i].name);
				return buf;
			}
		}
		if (dt.code == kDLBfloat && dt.bits == 16) {
			snprintf(buf, len, "bfloat16");
			return buf;
		}
	}
	snprintf(buf, len, "dtype(%u,%u,%u)", dt.code, dt.bits, dt.lanes);
	return buf;
}

int npy_descr_format(DLDataType dt, char *buf, size_t len, char *err, size_t errlen)
{
	char name[40];
	size_t i;

	if (dt.lanes == 1) {
		for (i = 0; i < N_TYPES; i++) {
			if (npy_types[i].code != dt.code || npy_types[i].size * 8 != dt.bits)
				continue;
			snprintf(buf, len, "%c%c%u", npy_types[i].size == 1 ? '|' : NPY_NATIVE,
				 npy_types[i].kind, npy_types[i].size);
			return 0;
		}
	}
	return npy_fail(-ENOTSUP, err, errlen,
			"dtype %s has no .npy equivalent (numpy has no such type)",
			npy_dtype_str(dt, name, sizeof(name)));
}

/* Why a descr we recognise as numpy's is still refused; NULL if unknown. */
static const char *refusal(char kind)
{
	switch (kind) {
	case 'O':
		return "object arrays hold pickled Python objects";
	case 'S':
	case 'a':
	case 'U':
		return "string dtypes are not supported";
	case 'V':
		return "raw void dtypes are not supported";
	case 'M':
	case 'm':
		return "datetime dtypes are not supported";
	default:
		return NULL;
	}
}

int npy_descr_parse(const char *descr, DLDataType *ret_dtype, char *err, size_t errlen)
{
	const char *p = descr;
	char order = '=';
	char kind, *end;
	unsigned long size;
	const char *why;
	size_t i;

	/* Names numpy.dtype() accepts too, which a hand-written header may use. */
	for (i = 0; i < N_TYPES; i++) {
		if (strcmp(descr, npy_types[i].name) == 0) {
			ret_dtype->code = npy_types[i].code;
			ret_dtype->bits = (uint8_t)(npy_types[i].size * 8);
			ret_dtype->lanes = 1;
			return 0;
		}
	}
	if (strcmp(descr, "?") == 0 || strcmp(descr, "|?") == 0) {
		*ret_dtype = (DLDataType){ kDLBool, 8, 1 };
		return 0;
	}

	if (*p == '<' || *p == '>' || *p == '|' || *p == '=')
		order = *p++;
	kind = *p;
	if (kind == '\0')
		return npy_fail(-ENOTSUP, err, errlen, "unsupported dtype '%s'", descr);
	why = refusal(kind);
	if (why)
		return npy_fail(-ENOTSUP, err, errlen, "unsupported dtype '%s': %s", descr, why);
	p++;
	errno = 0;
	size = strtoul(p, &end, 10);
	if (end == p || *end != '\0' || errno || p[0] == '+' || p[0] == '-' || p[0] == ' ')
		return npy_fail(-ENOTSUP, err, errlen, "unsupported dtype '%s'", descr);

	for (i = 0; i < N_TYPES; i++) {
		if (npy_types[i].kind == kind && npy_types[i].size == size)
			break;
	}
	if (i == N_TYPES) {
		if ((kind == 'f' && size > 8) || (kind == 'c' && size > 16))
			return npy_fail(-ENOTSUP, err, errlen,
					"unsupported dtype '%s': long double", descr);
		return npy_fail(-ENOTSUP, err, errlen, "unsupported dtype '%s'", descr);
	}
	/* One-byte types have no byte order; numpy writes them with '|'. */
	if (size > 1 && order != '=' && order != '|' && order != NPY_NATIVE)
		return npy_fail(-ENOTSUP, err, errlen, "unsupported dtype '%s': %s byte order",
				descr, order == '>' ? "big-endian" : "little-endian");
	*ret_dtype = (DLDataType){ npy_types[i].code, (uint8_t)(size * 8), 1 };
	return 0;
}

int64_t npy_header_size(const void *buf, size_t len, char *err, size_t errlen)
{
	const uint8_t *b = buf;
	uint64_t hlen, total;

	if (memcmp(b, NPY_MAGIC, len < NPY_MAGIC_LEN ? len : NPY_MAGIC_LEN) != 0)
		return npy_fail(-EINVAL, err, errlen, "not a .npy file (bad magic)");
	if (len < 10)
		return npy_fail(-ENODATA, err, errlen,
				"truncated: %zu bytes, shorter than a .npy preamble", len);
	if (b[6] < 1 || b[6] > 3 || b[7] != 0)
		return npy_fail(-ENOTSUP, err, errlen, "unsupported .npy format version %u.%u",
				b[6], b[7]);
	if (b[6] == 1) {
		hlen = (uint64_t)b[8] | (uint64_t)b[9] << 8;
		total = 10 + hlen;
	} else {
		if (len < 12)
			return npy_fail(-ENODATA, err, errlen,
					"truncated: %zu bytes, shorter than a .npy preamble", len);
		hlen = (uint64_t)b[8] | (uint64_t)b[9] << 8 | (uint64_t)b[10] << 16 |
		       (uint64_t)b[11] << 24;
		total = 12 + hlen;
	}
	if (total > NPY_HEADER_MAX)
		return npy_fail(-EMSGSIZE, err, errlen,
				"header of %llu bytes is too long (limit %d)",
				(unsigned long long)total, NPY_HEADER_MAX);
	return (int64_t)total;
}

/* A read position in the header text. */
struct cur {
	const char *p;
	const char *end;
};

static void skip_ws(struct cur *c)
{
	while (c->p < c->end && (*c->p == ' ' || *c->p == '\t' || *c->p == '\n' || *c->p == '\r'))
		c->p++;
}

static bool eat(struct cur *c, char ch)
{
	skip_ws(c);
	if (c->p < c->end && *c->p == ch) {
		c->p++;
		return true;
	}
	return false;
}

static bool eat_word(struct cur *c, const char *w)
{
	size_t n = strlen(w);

	skip_ws(c);
	if ((size_t)(c->end - c->p) >= n && memcmp(c->p, w, n) == 0) {
		c->p += n;
		return true;
	}
	return false;
}

/*
 * A Python string literal, quoted with ' or ", without escapes (no valid
 * header key or descr we accept contains one). false if malformed or longer
 * than outlen - 1.
 */
static bool parse_str(struct cur *c, char *out, size_t outlen)
{
	const char *s;
	char q;

	skip_ws(c);
	if (c->p >= c->end || (*c->p != '\'' && *c->p != '"'))
		return false;
	q = *c->p++;
	for (s = c->p; c->p < c->end && *c->p != q; c->p++) {
		if (*c->p == '\\' || *c->p == '\n')
			return false;
	}
	if (c->p >= c->end || (size_t)(c->p - s) >= outlen)
		return false;
	memcpy(out, s, (size_t)(c->p - s));
	out[c->p - s] = '\0';
	c->p++;
	return true;
}

/* (), (n,), (n, m), ... with Python 2's trailing L tolerated. */
static int parse_shape(struct cur *c, struct npy_header *h, char *err, size_t errlen)
{
	int64_t v;

	h->ndim = 0;
	if (!eat(c, '('))
		return npy_fail(-EINVAL, err, errlen, "malformed header: 'shape' is not a tuple");
	for (;;) {
		if (eat(c, ')'))
			return 0;
		skip_ws(c);
		if (c->p >= c->end || *c->p < '0' || *c->p > '9')
			return npy_fail(-EINVAL, err, errlen,
					"malformed header: 'shape' holds something other than "
					"non-negative integers");
		for (v = 0; c->p < c->end && *c->p >= '0' && *c->p <= '9'; c->p++) {
			if (v > (INT64_MAX - 9) / 10)
				return npy_fail(-EINVAL, err, errlen,
						"malformed header: a dimension is too large");
			v = v * 10 + (*c->p - '0');
		}
		if (c->p < c->end && (*c->p == 'L' || *c->p == 'l'))
			c->p++;
		if (h->ndim == TENSORD_NDIM_MAX)
			return npy_fail(-ENOTSUP, err, errlen, "more than %d dimensions",
					TENSORD_NDIM_MAX);
		h->shape[h->ndim++] = v;
		if (eat(c, ')'))
			break;
		if (!eat(c, ','))
			return npy_fail(-EINVAL, err, errlen,
					"malformed header: bad 'shape' tuple");
	}
	/* Python writes a 1-tuple as (n,); (n) is just n, but numpy never writes it. */
	return 0;
}

static int parse_dict(struct cur *c, struct npy_header *h, char *err, size_t errlen)
{
	bool have_descr = false, have_order = false, have_shape = false;
	char key[32];
	int rc;

	if (!eat(c, '{'))
		return npy_fail(-EINVAL, err, errlen, "malformed header: not a Python dict");
	while (!eat(c, '}')) {
		if (!parse_str(c, key, sizeof(key)) || !eat(c, ':'))
			return npy_fail(-EINVAL, err, errlen,
					"malformed header: expected a quoted key");
		if (strcmp(key, "descr") == 0) {
			skip_ws(c);
			if (c->p < c->end && (*c->p == '[' || *c->p == '{'))
				return npy_fail(-ENOTSUP, err, errlen,
						"unsupported dtype: structured (record) dtypes are "
						"not supported");
			if (!parse_str(c, h->descr, sizeof(h->descr)))
				return npy_fail(-EINVAL, err, errlen,
						"malformed header: 'descr' is not a dtype string");
			have_descr = true;
		} else if (strcmp(key, "fortran_order") == 0) {
			if (eat_word(c, "True"))
				h->fortran_order = true;
			else if (eat_word(c, "False"))
				h->fortran_order = false;
			else
				return npy_fail(-EINVAL, err, errlen, "malformed header: "
						"'fortran_order' is not True or False");
			have_order = true;
		} else if (strcmp(key, "shape") == 0) {
			rc = parse_shape(c, h, err, errlen);
			if (rc < 0)
				return rc;
			have_shape = true;
		} else {
			return npy_fail(-EINVAL, err, errlen,
					"malformed header: unexpected key '%s'", key);
		}
		if (!eat(c, ',')) {
			if (!eat(c, '}'))
				return npy_fail(-EINVAL, err, errlen,
						"malformed header: expected ',' or '}'");
			break;
		}
	}
	skip_ws(c);
	if (c->p != c->end)
		return npy_fail(-EINVAL, err, errlen, "malformed header: text after the dict");
	if (!have_descr || !have_order || !have_shape)
		return npy_fail(-EINVAL, err, errlen, "malformed header: missing key '%s'",
				!have_descr ? "descr" : !have_order ? "fortran_order" : "shape");
	return 0;
}

int npy_parse_header(const void *buf, size_t len, struct npy_header *ret, char *err,
		     size_t errlen)
{
	const uint8_t *b = buf;
	struct npy_header h;
	struct cur c;
	int64_t total;
	uint64_t count = 1;
	int32_t i;
	int rc;

	total = npy_header_size(buf, len, err, errlen);
	if (total < 0)
		return (int)total;
	if ((uint64_t)total > len)
		return npy_fail(-ENODATA, err, errlen,
				"truncated: header needs %lld bytes, have %zu", (long long)total,
				len);

	memset(&h, 0, sizeof(h));
	h.version_major = b[6];
	h.version_minor = b[7];
	h.data_offset = (uint64_t)total;
	c.p = (const char *)b + (h.version_major == 1 ? 10 : 12);
	c.end = (const char *)b + total;
	/* A NUL would end every string function early; no valid header has one. */
	if (memchr(c.p, '\0', (size_t)(c.end - c.p)))
		return npy_fail(-EINVAL, err, errlen, "malformed header: contains a NUL byte");
	rc = parse_dict(&c, &h, err, errlen);
	if (rc < 0)
		return rc;
	rc = npy_descr_parse(h.descr, &h.dtype, err, errlen);
	if (rc < 0)
		return rc;
	h.itemsize = h.dtype.bits / 8;
	for (i = 0; i < h.ndim; i++) {
		if (__builtin_mul_overflow(count, (uint64_t)h.shape[i], &count))
			return npy_fail(-EINVAL, err, errlen, "shape is too large (overflow)");
	}
	h.count = count;
	if (__builtin_mul_overflow(count, (uint64_t)h.itemsize, &h.data_bytes) ||
	    h.data_bytes > INT64_MAX)
		return npy_fail(-EINVAL, err, errlen, "shape is too large (overflow)");
	*ret = h;
	return 0;
}

int npy_read_header(FILE *f, struct npy_header *ret, char *err, size_t errlen)
{
	uint8_t pre[NPY_PREAMBLE_MAX];
	int64_t total;
	size_t n;
	char *buf;
	int rc;

	/* The 1.0 preamble is 10 bytes; read those first so a tiny file reads right. */
	n = fread(pre, 1, 10, f);
	if (ferror(f))
		return npy_fail(-EIO, err, errlen, "read error: %s", strerror(errno));
	if (n == 10 && pre[6] != 1 && memcmp(pre, NPY_MAGIC, NPY_MAGIC_LEN) == 0)
		n += fread(pre + 10, 1, 2, f);
	total = npy_header_size(pre, n, err, errlen);
	if (total < 0)
		return (int)total;
	if ((uint64_t)total < n)
		return npy_fail(-EINVAL, err, errlen, "malformed header: empty");

	/* Bounded by NPY_HEADER_MAX; freed before returning. */
	buf = malloc((size_t)total);
	if (!buf)
		return npy_fail(-ENOMEM, err, errlen, "out of memory");
	memcpy(buf, pre, n);
	if (fread(buf + n, 1, (size_t)total - n, f) != (size_t)total - n) {
		rc = ferror(f) ? npy_fail(-EIO, err, errlen, "read error: %s", strerror(errno))
				   : npy_fail(-ENODATA, err, errlen,
					  "truncated: header needs %lld bytes, file is shorter",
					  (long long)total);
		free(buf);
		return rc;
	}
	rc = npy_parse_header(buf, (size_t)total, ret, err, errlen);
	free(buf);
	return rc;
}

void npy_header_strides(const struct npy_header *h, int64_t *strides)
{
	int64_t s = 1;
	int32_t i;

	if (h->fortran_order) {
		for (i = 0; i < h->ndim; i++) {
			strides[i] = s;
			s *= h->shape[i] ? h->shape[i] : 1;
		}
	} else {
		for (i = h->ndim - 1; i >= 0; i--) {
			strides[i] = s;
			s *= h->shape[i] ? h->shape[i] : 1;
		}
	}
}

int npy_map_fd(int fd, struct npy_map *m, char *err, size_t errlen)
{
	struct stat st;
	void *base;
	int rc;

	memset(m, 0, sizeof(*m));
	if (fstat(fd, &st) < 0)
		return npy_fail(-errno, err, errlen, "%s", strerror(errno));
	if (!S_ISREG(st.st_mode))
		return npy_fail(-EINVAL, err, errlen, "not a regular file");
	if (st.st_size == 0)
		return npy_fail(-ENODATA, err, errlen, "empty file");
	if ((uint64_t)st.st_size > SIZE_MAX)
		return npy_fail(-EFBIG, err, errlen, "file too large to map");
	base = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
	if (base == MAP_FAILED)
		return npy_fail(-errno, err, errlen, "cannot map: %s", strerror(errno));

	rc = npy_parse_header(base, (size_t)st.st_size, &m->hdr, err, errlen);
	if (rc == 0 && m->hdr.data_bytes > (uint64_t)st.st_size - m->hdr.data_offset)
		rc = npy_fail(-ENODATA, err, errlen,
			      "truncated: header promises %llu data bytes, file has %llu",
			      (unsigned long long)m->hdr.data_bytes,
			      (unsigned long long)((uint64_t)st.st_size - m->hdr.data_offset));
	if (rc < 0) {
		munmap(base, (size_t)st.st_size);
		memset(m, 0, sizeof(*m));
		return rc;
	}
	/* The data is read once, front to back, by the copy into the tensor. */
	madvise(base, (size_t)st.st_size, MADV_SEQUENTIAL);
	m->base = base;
	m->size = (size_t)st.st_size;
	m->data = (const char *)base + m->hdr.data_offset;
	return 0;
}

void npy_unmap(struct npy_map *m)
{
	if (m->base)
		munmap(m->base, m->size);
	m->base = NULL;
	m->data = NULL;
	m->size = 0;
}

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

int npy_write(FILE *f, const DLTensor *t, char *err, size_t errlen)
{
	int64_t strides[TENSORD_NDIM_MAX], idx[TENSORD_NDIM_MAX];
	char hdr[4096];
	const char *base;
	uint64_t count = 1;
	int64_t off, block;
	size_t itemsize;
	struct stage *s;
	int32_t d, k;
	int n, rc;

	if (!td_device_host_accessible(t->device.device_type))
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
	itemsize = t->dtype.bits / 8;
	for (d = 0; d < t->ndim; d++)
		count *= (uint64_t)t->shape[d];
	if (count && !t->data)
		return npy_fail(-EINVAL, err, errlen, "tensor has no data pointer");

	if (fwrite(hdr, 1, (size_t)n, f) != (size_t)n)
		return npy_fail(-EIO, err, errlen, "write error: %s", strerror(errno));
	if (count == 0)
		return 0;

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
