/*
 * Reading .npy files: the preamble, the header's Python dict literal (a
 * small hand-written parser that accepts exactly what numpy writes, and
 * refuses the rest with a reason), and whole files mapped read-only.
 */
#include "npy.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>

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
				return npy_fail(-EINVAL, err, errlen,
						"malformed header: "
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
				!have_descr   ? "descr"
				: !have_order ? "fortran_order"
					      : "shape");
	return 0;
}

int npy_parse_header(const void *buf, size_t len, struct npy_header *ret, char *err, size_t errlen)
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
