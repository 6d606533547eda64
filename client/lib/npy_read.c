/*
 * Reading .npy files: the preamble, the header's Python dict literal (a
 * small hand-written parser that accepts exactly what numpy writes, and
 * refuses the rest with a reason), and the data, read with pread() into
 * the caller's memory.
 *
 * Why not mmap: a mapped file that another process truncates turns the
 * copy into SIGBUS, and the mapping saves nothing, since the data is
 * copied once either way (page cache to tensor); pread() reports the
 * shrink as a short read instead.
 */
#include "npy.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

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

int npy_regular(const struct stat *st, char *err, size_t errlen)
{
	const char *what = S_ISFIFO(st->st_mode)   ? "a FIFO (named pipe)"
			   : S_ISDIR(st->st_mode)  ? "a directory"
			   : S_ISCHR(st->st_mode)  ? "a character device"
			   : S_ISBLK(st->st_mode)  ? "a block device"
			   : S_ISSOCK(st->st_mode) ? "a socket"
			   : S_ISLNK(st->st_mode)  ? "a symbolic link"
						   : "of an unknown type";

	if (S_ISREG(st->st_mode))
		return 0;
	return npy_fail(-EINVAL, err, errlen, "is %s, not a regular file", what);
}

/*
 * Reads n bytes at off into buf, retrying short reads and EINTR. *got:
 * the bytes read, less than n when the file ended first. 0 or -errno.
 */
static int pread_full(int fd, void *buf, size_t n, uint64_t off, size_t *got)
{
	ssize_t r;

	for (*got = 0; *got < n; *got += (size_t)r) {
		r = pread(fd, (char *)buf + *got, n - *got, (off_t)(off + *got));
		if (r < 0 && errno == EINTR)
			r = 0;
		else if (r < 0)
			return -errno;
		else if (r == 0)
			break;
	}
	return 0;
}

int npy_open_fd(int fd, struct npy_header *ret, char *err, size_t errlen)
{
	uint8_t pre[NPY_PREAMBLE_MAX], *buf;
	struct stat st;
	int64_t total;
	size_t got;
	int rc;

	if (fstat(fd, &st) < 0)
		return npy_fail(-errno, err, errlen, "%s", strerror(errno));
	if ((rc = npy_regular(&st, err, errlen)) < 0)
		return rc;
	if (st.st_size == 0)
		return npy_fail(-ENODATA, err, errlen, "empty file");
	rc = pread_full(fd, pre, sizeof(pre), 0, &got);
	if (rc < 0)
		return npy_fail(rc, err, errlen, "read error: %s", strerror(-rc));
	total = npy_header_size(pre, got, err, errlen);
	if (total < 0)
		return (int)total;
	if ((uint64_t)total > (uint64_t)st.st_size)
		return npy_fail(-ENODATA, err, errlen,
				"truncated: header needs %lld bytes, file has %lld",
				(long long)total, (long long)st.st_size);

	/* Bounded by NPY_HEADER_MAX; freed before returning. */
	buf = malloc((size_t)total);
	if (!buf)
		return npy_fail(-ENOMEM, err, errlen, "out of memory");
	rc = pread_full(fd, buf, (size_t)total, 0, &got);
	if (rc < 0)
		rc = npy_fail(rc, err, errlen, "read error: %s", strerror(-rc));
	else if (got < (size_t)total)
		rc = npy_fail(-ENODATA, err, errlen,
			      "file shrank while reading (%zu of %lld header bytes)", got,
			      (long long)total);
	else
		rc = npy_parse_header(buf, (size_t)total, ret, err, errlen);
	free(buf);
	if (rc < 0)
		return rc;
	if (ret->data_bytes > (uint64_t)st.st_size - ret->data_offset)
		return npy_fail(-ENODATA, err, errlen,
				"truncated: header promises %llu data bytes, file has %llu",
				(unsigned long long)ret->data_bytes,
				(unsigned long long)((uint64_t)st.st_size - ret->data_offset));
	/* The data is read once, front to back. */
	posix_fadvise(fd, (off_t)ret->data_offset, 0, POSIX_FADV_SEQUENTIAL);
	return 0;
}

int npy_read_data(int fd, const struct npy_header *h, void *dst, char *err, size_t errlen)
{
	size_t got;
	int rc;

	if (h->data_bytes > SIZE_MAX)
		return npy_fail(-EFBIG, err, errlen, "too large for this machine's memory");
	rc = pread_full(fd, dst, (size_t)h->data_bytes, h->data_offset, &got);
	if (rc < 0)
		return npy_fail(rc, err, errlen, "read error: %s", strerror(-rc));
	if (got < h->data_bytes)
		return npy_fail(-ENODATA, err, errlen,
				"file shrank while reading (%zu of %llu bytes)", got,
				(unsigned long long)h->data_bytes);
	return 0;
}
