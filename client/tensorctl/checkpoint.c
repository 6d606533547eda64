/*
 * tensorctl put PREFIX FILE.npz | FILE.safetensors: every array of a
 * checkpoint becomes the tensor PREFIX + its name, all of them members of
 * one transaction, so they appear together in one commit or not at all.
 *
 * Two passes. The first reads what the file says it holds (names, dtypes,
 * shapes, where the bytes are) and checks all of it, so that a bad array
 * name or dtype fails before anything is sent. The second creates each
 * member and reads its bytes straight into it: one copy, no buffer the
 * size of the array. Any failure aborts the transaction: nothing shows.
 *
 * The containers are read with maintained libraries: .npz with libzip
 * (each member a .npy, inflated as it is read, its header parsed by
 * npy_read.c), .safetensors's JSON header with jansson (its data is
 * pread() from the file).
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>

#include <jansson.h>
#include <zip.h>

#include "npy.h"
#include "tensorctl.h"

/* safetensors' own bound on its JSON header (the Rust crate's MAX_HEADER_SIZE). */
#define ST_HEADER_MAX 100000000u

/* One array of the file, as the first pass found it. */
struct array {
	char *array; /* its name in the file (owned) */
	char name[TENSORD_NAME_MAX + 1];
	DLDataType dtype;
	int32_t ndim;
	int64_t shape[TENSORD_NDIM_MAX];
	bool fortran;
	uint64_t nbytes;
	uint64_t index;  /* .npz: the member's index */
	uint64_t offset; /* .npz: the data's offset in the member; .safetensors: in the file */
};

struct checkpoint {
	const char *path;
	int fd; /* .safetensors */
	zip_t *zip;
	struct array *v;
	size_t n, cap;
	char err[512];
	int rc; /* of the failure err describes */
};

/* Reads the bytes of a into dst (a->nbytes); 0, or -errno with the reason in cp->err. */
typedef int read_fn(struct checkpoint *cp, const struct array *a, void *dst);

enum ckpt_kind { CKPT_NONE, CKPT_NPZ, CKPT_SAFETENSORS };

static enum ckpt_kind kind_of(const char *path)
{
	size_t n = strlen(path);

	if (n > 4 && strcasecmp(path + n - 4, ".npz") == 0)
		return CKPT_NPZ;
	if (n > 12 && strcasecmp(path + n - 12, ".safetensors") == 0)
		return CKPT_SAFETENSORS;
	return CKPT_NONE;
}

bool is_checkpoint(const char *path)
{
	return kind_of(path) != CKPT_NONE;
}

static int __attribute__((format(printf, 3, 4)))
fail(struct checkpoint *cp, int rc, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(cp->err, sizeof(cp->err), fmt, ap);
	va_end(ap);
	/* A damaged or short file is a malformed one: an errno tensord_err_name() names. */
	cp->rc = rc == -EIO || rc == -ENODATA ? -EBADMSG : rc;
	return rc;
}

/* 'name' of an array, escaped (it comes from the file). Borrowed: buf. */
static const char *aq(const char *array, char *buf, size_t len)
{
	return quote(array, QUOTE_MSG, buf, len);
}

/*
 * Adds an array named array (len bytes, from the file) under prefix; its
 * tensord name must be valid (tensord.h: 1 to 255 bytes of
 * [A-Za-z0-9._:/-]). The new entry, or NULL with the reason in cp->err.
 */
static struct array *add_array(struct checkpoint *cp, const char *prefix, const char *array,
			       size_t len)
{
	char q[QUOTE_MAX], *copy;
	size_t plen = strlen(prefix), i;
	struct array *a;

	copy = strndup(array, len);
	if (!copy) {
		fail(cp, -ENOMEM, "out of memory");
		return NULL;
	}
	if (len == 0 || strlen(copy) != len || plen + len > TENSORD_NAME_MAX) {
		fail(cp, -EINVAL, "array %s: %s", aq(copy, q, sizeof(q)),
		     plen + len > TENSORD_NAME_MAX ? "the prefix and its name are over 255 bytes"
						   : "not a valid name");
		free(copy);
		return NULL;
	}
	for (i = 0; i < len; i++) {
		unsigned char ch = (unsigned char)copy[i];

		if (!((ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') ||
		      (ch >= '0' && ch <= '9') || strchr("._:/-", ch))) {
			fail(cp, -EINVAL,
			     "array %s: byte 0x%02x at offset %zu cannot be in a tensor name "
			     "([A-Za-z0-9._:/-])",
			     aq(copy, q, sizeof(q)), ch, i);
			free(copy);
			return NULL;
		}
	}
	if (cp->n == cp->cap) {
		size_t cap = cp->cap ? 2 * cp->cap : 16;
		struct array *nv = realloc(cp->v, cap * sizeof(*nv));

		if (!nv) {
			free(copy);
			fail(cp, -ENOMEM, "out of memory");
			return NULL;
		}
		cp->v = nv;
		cp->cap = cap;
	}
	a = &cp->v[cp->n++];
	memset(a, 0, sizeof(*a));
	a->array = copy;
	snprintf(a->name, sizeof(a->name), "%s%s", prefix, copy);
	return a;
}

static int by_name(const void *x, const void *y)
{
	return strcmp(((const struct array *)x)->name, ((const struct array *)y)->name);
}

static int by_offset(const void *x, const void *y)
{
	const struct array *a = x, *b = y;

	/* An empty array shares its offset with the next one: it goes first. */
	if (a->offset != b->offset)
		return a->offset < b->offset ? -1 : 1;
	return a->nbytes < b->nbytes ? -1 : a->nbytes > b->nbytes ? 1 : 0;
}

/* --- .npz: libzip -------------------------------------------------------------------- */

/* Reads up to n bytes of f into buf; the bytes read, or -EIO with the reason. */
static int64_t zread(struct checkpoint *cp, zip_file_t *f, const struct array *a, void *buf,
		     uint64_t n)
{
	uint64_t got = 0;
	zip_int64_t r;
	char q[QUOTE_MAX];

	while (got < n) {
		r = zip_fread(f, (char *)buf + got, n - got);
		if (r < 0)
			return fail(cp, -EIO, "member %s: %s", aq(a->array, q, sizeof(q)),
				    zip_error_strerror(zip_file_get_error(f)));
		if (r == 0)
			break;
		got += (uint64_t)r;
	}
	return (int64_t)got;
}

/* Opens member a->index; NULL with the reason in cp->err. */
static zip_file_t *zopen(struct checkpoint *cp, const struct array *a)
{
	zip_file_t *f = zip_fopen_index(cp->zip, a->index, 0);
	char q[QUOTE_MAX];

	if (!f)
		fail(cp, -EIO, "member %s: %s", aq(a->array, q, sizeof(q)),
		     zip_error_strerror(zip_get_error(cp->zip)));
	return f;
}

/* Reads and parses the .npy header of member a into a. */
static int npz_header(struct checkpoint *cp, struct array *a, uint64_t size)
{
	char q[QUOTE_MAX], why[256];
	struct npy_header h;
	uint8_t *buf = NULL;
	int64_t total, got;
	zip_file_t *f;
	int rc;

	if (!(f = zopen(cp, a)))
		return -EIO;
	buf = malloc(NPY_HEADER_MAX);
	if (!buf) {
		rc = fail(cp, -ENOMEM, "out of memory");
		goto out;
	}
	got = zread(cp, f, a, buf, NPY_PREAMBLE_MAX);
	if ((rc = got < 0 ? (int)got : 0) < 0)
		goto out;
	total = npy_header_size(buf, (size_t)got, why, sizeof(why));
	if (total >= 0 && total > got) {
		int64_t more = zread(cp, f, a, buf + got, (uint64_t)(total - got));

		if (more < 0) {
			rc = (int)more;
			goto out;
		}
		if (got + more < total)
			total = npy_fail(-ENODATA, why, sizeof(why),
					 "truncated: header needs %lld bytes, member is shorter",
					 (long long)total);
	}
	rc = total < 0 ? (int)total : npy_parse_header(buf, (size_t)total, &h, why, sizeof(why));
	if (rc < 0) {
		fail(cp, rc, "member %s: %s", aq(a->array, q, sizeof(q)), why);
		goto out;
	}
	if (h.data_offset > size || h.data_bytes > size - h.data_offset) {
		rc = fail(cp, -ENODATA,
			  "member %s: truncated: header promises %" PRIu64
			  " data bytes, member has %" PRIu64,
			  aq(a->array, q, sizeof(q)), h.data_bytes,
			  size > h.data_offset ? size - h.data_offset : 0);
		goto out;
	}
	a->dtype = h.dtype;
	a->ndim = h.ndim;
	memcpy(a->shape, h.shape, sizeof(a->shape));
	a->fortran = h.fortran_order;
	a->nbytes = h.data_bytes;
	a->offset = h.data_offset;
out:
	free(buf);
	zip_fclose(f);
	return rc;
}

static int npz_scan(struct checkpoint *cp, const char *prefix)
{
	char q[QUOTE_MAX];
	zip_int64_t n;
	zip_stat_t st;
	struct array *a;
	size_t len;
	int zerr, rc;

	cp->zip = zip_fdopen(cp->fd, ZIP_RDONLY, &zerr);
	if (!cp->zip) {
		zip_error_t ze;

		zip_error_init_with_code(&ze, zerr);
		rc = fail(cp, -EINVAL, "not a readable .npz (zip) file: %s",
			  zip_error_strerror(&ze));
		zip_error_fini(&ze);
		return rc;
	}
	cp->fd = -1; /* the archive's now */
	n = zip_get_num_entries(cp->zip, 0);
	for (zip_int64_t i = 0; i < n; i++) {
		if (zip_stat_index(cp->zip, (zip_uint64_t)i, 0, &st) < 0 ||
		    !(st.valid & ZIP_STAT_NAME) || !(st.valid & ZIP_STAT_SIZE))
			return fail(cp, -EIO, "member %lld: %s", (long long)i,
				    zip_error_strerror(zip_get_error(cp->zip)));
		/* numpy.savez names each member ARRAY.npy. */
		len = strlen(st.name);
		if (len < 4 || strcmp(st.name + len - 4, ".npy") != 0)
			return fail(
				cp, -EINVAL,
				"member %s is not a .npy array (numpy.savez names them NAME.npy)",
				quote(st.name, QUOTE_MSG, q, sizeof(q)));
		a = add_array(cp, prefix, st.name, len - 4);
		if (!a)
			return -EINVAL;
		a->index = (uint64_t)i;
		if ((rc = npz_header(cp, a, st.size)) < 0)
			return rc;
	}
	return 0;
}

static int npz_read(struct checkpoint *cp, const struct array *a, void *dst)
{
	char q[QUOTE_MAX], skip[4096];
	zip_file_t *f;
	int64_t got = 0;
	uint64_t off;
	int rc = 0;

	if (!(f = zopen(cp, a)))
		return -EIO;
	/* Past the header again (inflating it), then the data straight into the tensor. */
	for (off = 0; off < a->offset && rc == 0; off += (uint64_t)got) {
		got = zread(cp, f, a, skip,
			    a->offset - off < sizeof(skip) ? a->offset - off : sizeof(skip));
		rc = got <= 0 ? (got < 0 ? (int)got : -ENODATA) : 0;
	}
	if (rc == 0) {
		got = zread(cp, f, a, dst, a->nbytes);
		if (got >= 0 && (uint64_t)got < a->nbytes)
			got = fail(cp, -ENODATA, "member %s: truncated (%lld of %" PRIu64 " bytes)",
				   aq(a->array, q, sizeof(q)), (long long)got, a->nbytes);
		rc = got < 0 ? (int)got : 0;
	}
	/* To its end, so that libzip checks the member's CRC. */
	while (rc == 0 && (got = zread(cp, f, a, skip, sizeof(skip))) > 0)
		;
	if (rc == 0 && got < 0)
		rc = (int)got;
	zip_fclose(f);
	if (rc == -ENODATA && !cp->err[0])
		fail(cp, rc, "member %s: truncated", aq(a->array, q, sizeof(q)));
	return rc;
}

/* --- .safetensors: jansson ----------------------------------------------------------- */

static const struct {
	const char *st, *tensord;
} st_dtypes[] = {
	{ "BOOL", "bool" },   { "U8", "uint8" },      { "I8", "int8" },       { "U16", "uint16" },
	{ "I16", "int16" },   { "F16", "float16" },   { "BF16", "bfloat16" }, { "U32", "uint32" },
	{ "I32", "int32" },   { "F32", "float32" },   { "U64", "uint64" },    { "I64", "int64" },
	{ "F64", "float64" }, { "C64", "complex64" },
};

/* One entry {"dtype", "shape", "data_offsets"} of the header into a. */
static int st_entry(struct checkpoint *cp, struct array *a, json_t *e, uint64_t data_len)
{
	json_t *dt = json_object_get(e, "dtype"), *sh = json_object_get(e, "shape"),
	       *off = json_object_get(e, "data_offsets"), *v;
	uint64_t begin, end, count = 1, itemsize;
	char q[QUOTE_MAX];
	const char *arr = aq(a->array, q, sizeof(q));
	size_t i, k;

	if (!json_is_object(e) || !json_is_string(dt) || !json_is_array(sh) || !json_is_array(off))
		return fail(
			cp, -EINVAL,
			"array %s: not an object with \"dtype\", \"shape\" and \"data_offsets\"",
			arr);
	for (k = 0; k < sizeof(st_dtypes) / sizeof(st_dtypes[0]); k++)
		if (strcmp(json_string_value(dt), st_dtypes[k].st) == 0)
			break;
	if (k == sizeof(st_dtypes) / sizeof(st_dtypes[0]) ||
	    tensord_dtype_parse(st_dtypes[k].tensord, &a->dtype) < 0) {
		char dq[QUOTE_MAX];

		return fail(cp, -ENOTSUP, "array %s: unsupported dtype %s", arr,
			    quote(json_string_value(dt), QUOTE_MSG, dq, sizeof(dq)));
	}
	itemsize = (uint64_t)(a->dtype.bits / 8) * a->dtype.lanes;
	if (json_array_size(sh) > TENSORD_NDIM_MAX)
		return fail(cp, -EINVAL, "array %s: %zu dimensions (at most %d)", arr,
			    json_array_size(sh), TENSORD_NDIM_MAX);
	a->ndim = (int32_t)json_array_size(sh);
	json_array_foreach(sh, i, v)
	{
		if (!json_is_integer(v) || json_integer_value(v) < 0)
			return fail(cp, -EINVAL, "array %s: shape holds %s", arr,
				    json_is_integer(v) ? "a negative extent" : "a non-integer");
		a->shape[i] = json_integer_value(v);
		if (a->shape[i] && count > UINT64_MAX / (uint64_t)a->shape[i])
			return fail(cp, -EINVAL, "array %s: shape overflows", arr);
		count *= (uint64_t)a->shape[i];
	}
	if (count > UINT64_MAX / itemsize)
		return fail(cp, -EINVAL, "array %s: shape overflows", arr);
	if (json_array_size(off) != 2 || !json_is_integer(json_array_get(off, 0)) ||
	    !json_is_integer(json_array_get(off, 1)) ||
	    json_integer_value(json_array_get(off, 0)) < 0 ||
	    json_integer_value(json_array_get(off, 1)) < 0)
		return fail(cp, -EINVAL, "array %s: data_offsets is not [BEGIN, END]", arr);
	begin = (uint64_t)json_integer_value(json_array_get(off, 0));
	end = (uint64_t)json_integer_value(json_array_get(off, 1));
	if (begin > end || end > data_len)
		return fail(cp, -EINVAL,
			    "array %s: data_offsets [%" PRIu64 ", %" PRIu64
			    "] are not inside the %" PRIu64 " data bytes",
			    arr, begin, end, data_len);
	if (end - begin != count * itemsize)
		return fail(cp, -EINVAL,
			    "array %s: data_offsets span %" PRIu64
			    " bytes, its dtype and shape need %" PRIu64,
			    arr, end - begin, count * itemsize);
	a->offset = begin;
	a->nbytes = end - begin;
	return 0;
}

static int st_scan(struct checkpoint *cp, const char *prefix)
{
	uint64_t hlen, data_len, at;
	uint8_t le[8];
	json_error_t jerr;
	struct stat st;
	json_t *root = NULL, *e;
	const char *key;
	char *buf = NULL;
	ssize_t r;
	int rc = 0;

	if (fstat(cp->fd, &st) < 0)
		return fail(cp, -errno, "%s", strerror(errno));
	r = pread(cp->fd, le, sizeof(le), 0);
	if (r != (ssize_t)sizeof(le))
		return fail(cp, r < 0 ? -errno : -ENODATA, "%s",
			    r < 0 ? strerror(errno)
				  : "truncated: shorter than a safetensors header");
	hlen = 0;
	for (int i = 7; i >= 0; i--)
		hlen = hlen << 8 | le[i];
	if (hlen > ST_HEADER_MAX)
		return fail(cp, -EMSGSIZE, "header of %" PRIu64 " bytes is too long (limit %u)",
			    hlen, ST_HEADER_MAX);
	if (hlen < 2 || hlen > (uint64_t)st.st_size - 8)
		return fail(cp, -ENODATA, "truncated: header of %" PRIu64 " bytes, file has %lld",
			    hlen, (long long)st.st_size - 8);
	data_len = (uint64_t)st.st_size - 8 - hlen;
	buf = malloc(hlen);
	if (!buf)
		return fail(cp, -ENOMEM, "out of memory for a header of %" PRIu64 " bytes", hlen);
	for (at = 0; at < hlen; at += (uint64_t)r) {
		r = pread(cp->fd, buf + at, hlen - at, (off_t)(8 + at));
		if (r <= 0) {
			rc = fail(cp, r < 0 ? -errno : -ENODATA, "%s",
				  r < 0 ? strerror(errno) : "file shrank while reading its header");
			goto out;
		}
	}
	/* safetensors headers start with '{' (the format says so; the crate checks it). */
	if (buf[0] != '{') {
		rc = fail(cp, -EINVAL, "not a safetensors file: its header is not a JSON object");
		goto out;
	}
	root = json_loadb(buf, hlen, JSON_REJECT_DUPLICATES, &jerr);
	if (!root || !json_is_object(root)) {
		char q[QUOTE_MAX];

		rc = fail(cp, -EINVAL, "malformed header: %s",
			  root ? "not a JSON object" : quote(jerr.text, QUOTE_TEXT, q, sizeof(q)));
		goto out;
	}
	json_object_foreach(root, key, e)
	{
		struct array *a;

		if (strcmp(key, "__metadata__") == 0) {
			if (!json_is_object(e)) {
				rc = fail(cp, -EINVAL,
					  "malformed header: __metadata__ is not an object");
				goto out;
			}
			continue;
		}
		a = add_array(cp, prefix, key, strlen(key));
		if (!a || (rc = st_entry(cp, a, e, data_len)) < 0) {
			rc = rc < 0 ? rc : -EINVAL;
			goto out;
		}
	}
	/*
	 * The arrays tile the data: in order, no gap, no overlap, nothing after
	 * (as the crate checks). A header of __metadata__ alone has none, and
	 * cp->v is NULL then: qsort() must not see it (UB, issue 30).
	 */
	if (cp->n > 1)
		qsort(cp->v, cp->n, sizeof(*cp->v), by_offset);
	at = 0;
	for (size_t i = 0; i < cp->n; i++) {
		char q[QUOTE_MAX];

		if (cp->v[i].offset != at) {
			rc = fail(cp, -EINVAL,
				  "array %s: data_offsets begin at %" PRIu64 ", expected %" PRIu64
				  " (arrays must tile the data without gaps or overlaps)",
				  aq(cp->v[i].array, q, sizeof(q)), cp->v[i].offset, at);
			goto out;
		}
		at += cp->v[i].nbytes;
	}
	if (at != data_len)
		rc = fail(cp, -EINVAL, "the arrays cover %" PRIu64 " of the %" PRIu64 " data bytes",
			  at, data_len);
	for (size_t i = 0; i < cp->n; i++)
		cp->v[i].offset += 8 + hlen;
out:
	json_decref(root);
	free(buf);
	return rc;
}

static int st_read(struct checkpoint *cp, const struct array *a, void *dst)
{
	uint64_t got;
	ssize_t r;
	char q[QUOTE_MAX];

	for (got = 0; got < a->nbytes; got += (uint64_t)r) {
		r = pread(cp->fd, (char *)dst + got, a->nbytes - got, (off_t)(a->offset + got));
		if (r < 0 && errno == EINTR)
			r = 0;
		else if (r < 0)
			return fail(cp, -errno, "array %s: read error: %s",
				    aq(a->array, q, sizeof(q)), strerror(errno));
		else if (r == 0)
			return fail(cp, -ENODATA,
				    "array %s: file shrank while reading (%" PRIu64 " of %" PRIu64
				    " bytes)",
				    aq(a->array, q, sizeof(q)), got, a->nbytes);
	}
	return 0;
}

/* --- the transaction ------------------------------------------------------------------ */

/* Creates every array as a member of one transaction and commits it; the exit status. */
static int publish_all(tensord_client *c, const struct args *a, struct checkpoint *cp,
		       read_fn *read_data)
{
	int64_t strides[TENSORD_NDIM_MAX];
	DLManagedTensorVersioned *t;
	tensord_tx *tx;
	uint64_t commit;
	char why[1024];
	int rc;

	rc = tensord_tx_begin(c, &tx);
	if (rc < 0)
		return op_error(rc, NULL);
	for (size_t i = 0; i < cp->n; i++) {
		const struct array *ar = &cp->v[i];
		tensord_spec spec = { .dtype = ar->dtype,
				      .ndim = ar->ndim,
				      .shape = ar->ndim ? ar->shape : NULL,
				      .device = { kDLCPU, 0 },
				      .flags = a->flags,
				      .mode = a->mode };
		struct npy_header h = { .fortran_order = ar->fortran, .ndim = ar->ndim };

		if (ar->fortran && ar->ndim > 1 && ar->nbytes > 0) {
			memcpy(h.shape, ar->shape, sizeof(h.shape));
			npy_header_strides(&h, strides);
			spec.strides = strides;
		}
		rc = tensord_tx_create(tx, ar->name, &spec, &t);
		if (rc < 0) {
			if (rc == -EEXIST && !(a->flags & TENSORD_REPLACE))
				rc = report(rc,
					    "already exists (put --force replaces tensors you own)",
					    ar->name);
			else
				rc = op_error(rc, ar->name);
			tensord_tx_free(tx);
			return rc;
		}
		rc = ar->nbytes ? read_data(cp, ar,
					    (char *)t->dl_tensor.data + t->dl_tensor.byte_offset)
				: 0;
		/* The member is the transaction's; this lease is only for writing it. */
		t->deleter(t);
		if (rc < 0) {
			tensord_tx_free(tx); /* aborts: nothing of it shows */
			return report_file(cp->rc, cp->path, cp->err);
		}
	}
	rc = tensord_tx_commit(tx, &commit);
	snprintf(why, sizeof(why), "%s", rc < 0 ? errmsg(rc) : "");
	tensord_tx_free(tx);
	if (rc < 0)
		return report(rc, why, NULL);

	if (a->seen & OPT_JSON) {
		printf("{\"commit\": %" PRIu64 ", \"tensors\": [", commit);
		for (size_t i = 0; i < cp->n; i++) {
			json_str(cp->v[i].name);
			fputs(i + 1 < cp->n ? ", " : "", stdout);
		}
		puts("]}");
	} else {
		printf("commit %" PRIu64 ": %zu tensor%s\n", commit, cp->n, cp->n == 1 ? "" : "s");
	}
	return finish_output();
}

int cmd_put_checkpoint(tensord_client *c, const struct args *a)
{
	const char *prefix = a->pos[0];
	enum ckpt_kind kind = kind_of(a->pos[1]);
	struct checkpoint cp = { .path = a->pos[1], .fd = -1 };
	char q[QUOTE_MAX];
	int rc;

	cp.fd = open_regular(cp.path);
	if (cp.fd < 0)
		return EXIT_OP;
	rc = kind == CKPT_NPZ ? npz_scan(&cp, prefix) : st_scan(&cp, prefix);
	if (rc == 0 && cp.n == 0)
		rc = fail(&cp, -ENOENT, "holds no arrays");
	if (rc == 0) {
		if (cp.n > 1)
			qsort(cp.v, cp.n, sizeof(*cp.v), by_name);
		for (size_t i = 1; i < cp.n && rc == 0; i++)
			if (strcmp(cp.v[i - 1].name, cp.v[i].name) == 0)
				rc = fail(&cp, -EINVAL, "array %s is there twice",
					  aq(cp.v[i].array, q, sizeof(q)));
	}
	rc = rc < 0 ? report_file(cp.rc, cp.path, cp.err)
		    : publish_all(c, a, &cp, kind == CKPT_NPZ ? npz_read : st_read);
	for (size_t i = 0; i < cp.n; i++)
		free(cp.v[i].array);
	free(cp.v);
	if (cp.zip)
		zip_discard(cp.zip);
	if (cp.fd >= 0)
		close(cp.fd);
	return rc;
}
