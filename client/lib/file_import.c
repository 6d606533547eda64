/*
 * tensord_put_file(): every array of a .npz, .safetensors or .npy file
 * becomes the tensor PREFIX + its name, all of them members of one
 * transaction, so they appear together in one commit or not at all.
 *
 * Two passes. The first reads what the file says it holds (names, dtypes,
 * shapes, where the bytes are) and checks all of it, so that a bad array
 * name or dtype, or a file shorter than its header says, fails before
 * anything is sent. The second creates each member and reads its bytes
 * straight into it: one copy, no buffer the size of the array. Any failure
 * aborts the transaction: nothing shows.
 *
 * The containers are read with maintained libraries: .npz with libzip
 * (each member a .npy, inflated as it is read, its header parsed by
 * npy_read.c), .safetensors's JSON header with jansson (its data is
 * pread() from the file, as a .npy's is).
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

#include "file.h"
#include "import.h"
#include "npy.h"

/* safetensors' own bound on its JSON header (the Rust crate's MAX_HEADER_SIZE). */
#define ST_HEADER_MAX 100000000u
/* Bytes read between two progress reports. */
#define CHUNK (64u << 20)

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
	uint64_t offset; /* .npz: the data's offset in the member; else in the file */
};

struct checkpoint {
	const char *path;
	int fd; /* .safetensors, .npy */
	zip_t *zip;
	struct array *v;
	size_t n, cap;
	char err[768];
	int rc; /* of the failure err describes */
	const tensord_file_options *opts;
	uint64_t done, total;
	bool single; /* a .npy: one tensor, named by the caller */
};

/* Reads the bytes of a into dst (a->nbytes); 0, or -errno with the reason in cp->err. */
typedef int read_fn(struct checkpoint *cp, const struct array *a, void *dst);

/* --- what import and export share ---------------------------------------------------- */

tensord_file_format td_file_format(const char *path)
{
	size_t n = path ? strlen(path) : 0;

	if (n > 4 && strcasecmp(path + n - 4, ".npz") == 0)
		return TENSORD_FILE_NPZ;
	if (n > 4 && strcasecmp(path + n - 4, ".npy") == 0)
		return TENSORD_FILE_NPY;
	if (n > 12 && strcasecmp(path + n - 12, ".safetensors") == 0)
		return TENSORD_FILE_SAFETENSORS;
	return TENSORD_FILE_AUTO;
}

/* safetensors' dtype names (the Rust crate's Dtype), each as one DLPack element. */
static const struct {
	const char *st;
	DLDataType dt;
} st_dtypes[] = {
	{ "BOOL", { kDLBool, 8, 1 } },
	{ "U8", { kDLUInt, 8, 1 } },
	{ "I8", { kDLInt, 8, 1 } },
	{ "U16", { kDLUInt, 16, 1 } },
	{ "I16", { kDLInt, 16, 1 } },
	{ "F16", { kDLFloat, 16, 1 } },
	{ "BF16", { kDLBfloat, 16, 1 } },
	{ "U32", { kDLUInt, 32, 1 } },
	{ "I32", { kDLInt, 32, 1 } },
	{ "F32", { kDLFloat, 32, 1 } },
	{ "U64", { kDLUInt, 64, 1 } },
	{ "I64", { kDLInt, 64, 1 } },
	{ "F64", { kDLFloat, 64, 1 } },
	{ "C64", { kDLComplex, 64, 1 } },
	{ "F8_E4M3", { kDLFloat8_e4m3fn, 8, 1 } },
	{ "F8_E5M2", { kDLFloat8_e5m2, 8, 1 } },
	{ "F8_E4M3FNUZ", { kDLFloat8_e4m3fnuz, 8, 1 } },
	{ "F8_E5M2FNUZ", { kDLFloat8_e5m2fnuz, 8, 1 } },
	{ "F8_E8M0", { kDLFloat8_e8m0fnu, 8, 1 } },
	{ "F6_E2M3", { kDLFloat6_e2m3fn, 6, 1 } },
	{ "F6_E3M2", { kDLFloat6_e3m2fn, 6, 1 } },
	{ "F4", { kDLFloat4_e2m1fn, 4, 1 } },
};
#define N_ST_DTYPES (sizeof(st_dtypes) / sizeof(st_dtypes[0]))

int td_st_dtype_parse(const char *s, DLDataType *ret)
{
	for (size_t k = 0; k < N_ST_DTYPES; k++)
		if (strcmp(s, st_dtypes[k].st) == 0) {
			*ret = st_dtypes[k].dt;
			return 0;
		}
	return -ENOTSUP;
}

const char *td_st_dtype_name(DLDataType dt, int *ret_lanes)
{
	for (size_t k = 0; k < N_ST_DTYPES; k++) {
		const DLDataType *d = &st_dtypes[k].dt;

		if (d->code != dt.code || d->bits != dt.bits)
			continue;
		/* torch's float4_e2m1fn_x2: two F4 values a DLPack element. */
		if (dt.lanes == 1 || (dt.code == kDLFloat4_e2m1fn && dt.lanes == 2)) {
			*ret_lanes = dt.lanes;
			return st_dtypes[k].st;
		}
	}
	return NULL;
}

const char *td_file_esc(const char *s, char *buf, size_t len)
{
	size_t o = 0;

	for (; *s && o + 5 < len; s++) {
		unsigned char ch = (unsigned char)*s;

		if (ch < 0x20 || ch >= 0x7f || ch == '\'' || ch == '\\')
			o += (size_t)snprintf(buf + o, len - o, "\\x%02x", ch);
		else
			buf[o++] = (char)ch;
	}
	if (*s && o + 3 < len)
		o += (size_t)snprintf(buf + o, len - o, "...");
	buf[o < len ? o : len - 1] = '\0';
	return buf;
}

int td_prefix_check(const char *prefix, const char *path, bool export)
{
	size_t n = strlen(prefix);
	char q[96];

	if (n == 0 || strchr("/._:-", prefix[n - 1]))
		return 0;
	td_file_esc(prefix, q, sizeof(q));
	if (export)
		return td_set_error(
			-EINVAL,
			"%s: prefix '%s' does not end in a separator: it would take "
			"'%sNAME' too; write '%s/' (or end it in '.', '_', ':' or '-'), "
			"or list the names",
			path, q, q, q);
	return td_set_error(-EINVAL,
			    "%s: prefix '%s' does not end in a separator: its tensors would be "
			    "named '%sNAME'; write '%s/' (or end it in '.', '_', ':' or '-')",
			    path, q, q, q);
}

/* --- the first pass ------------------------------------------------------------------ */

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
	return td_file_esc(array, buf, len);
}

static struct array *grow(struct checkpoint *cp)
{
	struct array *a;

	if (cp->n == cp->cap) {
		size_t cap = cp->cap ? 2 * cp->cap : 16;
		struct array *nv = realloc(cp->v, cap * sizeof(*nv));

		if (!nv) {
			fail(cp, -ENOMEM, "out of memory");
			return NULL;
		}
		cp->v = nv;
		cp->cap = cap;
	}
	a = &cp->v[cp->n++];
	memset(a, 0, sizeof(*a));
	return a;
}

/*
 * Adds an array named array (len bytes, from the file) under prefix; its
 * tensord name must be valid (1 to 255 bytes of [A-Za-z0-9._:/-]). The new
 * entry, or NULL with the reason in cp->err.
 */
static struct array *add_array(struct checkpoint *cp, const char *prefix, const char *array,
			       size_t len)
{
	char q[256], *copy;
	size_t plen = strlen(prefix), i;
	struct array *a;

	copy = strndup(array, len);
	if (!copy) {
		fail(cp, -ENOMEM, "out of memory");
		return NULL;
	}
	if (len == 0 || strlen(copy) != len || plen + len > TENSORD_NAME_MAX) {
		fail(cp, -EINVAL, "array '%s': %s", aq(copy, q, sizeof(q)),
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
			     "array '%s': byte 0x%02x at offset %zu cannot be in a tensor name "
			     "([A-Za-z0-9._:/-])",
			     aq(copy, q, sizeof(q)), ch, i);
			free(copy);
			return NULL;
		}
	}
	if (!(a = grow(cp))) {
		free(copy);
		return NULL;
	}
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

/* Counts n bytes as read, and tells the caller's progress function every CHUNK or so. */
static void advance(struct checkpoint *cp, uint64_t n)
{
	uint64_t before = cp->done;

	cp->done += n;
	if (cp->opts && cp->opts->progress &&
	    (cp->done / CHUNK != before / CHUNK || cp->done == cp->total))
		cp->opts->progress(cp->opts->progress_arg, cp->done, cp->total);
}

/* --- .npz: libzip -------------------------------------------------------------------- */

/* Reads up to n bytes of f into buf; the bytes read, or -EIO with the reason. */
static int64_t zread(struct checkpoint *cp, zip_file_t *f, const struct array *a, void *buf,
		     uint64_t n, bool count)
{
	uint64_t got = 0;
	zip_int64_t r;
	char q[256];

	while (got < n) {
		uint64_t want = n - got < CHUNK ? n - got : CHUNK;

		r = zip_fread(f, (char *)buf + got, want);
		if (r < 0)
			return fail(cp, -EIO, "member '%s': %s", aq(a->array, q, sizeof(q)),
				    zip_error_strerror(zip_file_get_error(f)));
		if (r == 0)
			break;
		got += (uint64_t)r;
		if (count)
			advance(cp, (uint64_t)r);
	}
	return (int64_t)got;
}

/* Opens member a->index; NULL with the reason in cp->err. */
static zip_file_t *zopen(struct checkpoint *cp, const struct array *a)
{
	zip_file_t *f = zip_fopen_index(cp->zip, a->index, 0);
	char q[256];

	if (!f)
		fail(cp, -EIO, "member '%s': %s", aq(a->array, q, sizeof(q)),
		     zip_error_strerror(zip_get_error(cp->zip)));
	return f;
}

/* Reads and parses the .npy header of member a into a. */
/* What a .npy header (of an .npz member or a .npy file) says of array a. */
static void array_from_npy(struct array *a, const struct npy_header *h)
{
	a->dtype = h->dtype;
	a->ndim = h->ndim;
	memcpy(a->shape, h->shape, sizeof(a->shape));
	a->fortran = h->fortran_order;
	a->nbytes = h->data_bytes;
	a->offset = h->data_offset;
}

static int npz_header(struct checkpoint *cp, struct array *a, uint64_t size)
{
	char q[256], why[256];
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
	got = zread(cp, f, a, buf, NPY_PREAMBLE_MAX, false);
	if ((rc = got < 0 ? (int)got : 0) < 0)
		goto out;
	total = npy_header_size(buf, (size_t)got, why, sizeof(why));
	if (total >= 0 && total > got) {
		int64_t more = zread(cp, f, a, buf + got, (uint64_t)(total - got), false);

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
		fail(cp, rc, "member '%s': %s", aq(a->array, q, sizeof(q)), why);
		goto out;
	}
	if (h.data_offset > size || h.data_bytes > size - h.data_offset) {
		rc = fail(cp, -ENODATA,
			  "member '%s': truncated: expected %" PRIu64
			  " data bytes, the member has %" PRIu64,
			  aq(a->array, q, sizeof(q)), h.data_bytes,
			  size > h.data_offset ? size - h.data_offset : 0);
		goto out;
	}
	array_from_npy(a, &h);
out:
	free(buf);
	zip_fclose(f);
	return rc;
}

static int npz_scan(struct checkpoint *cp, const char *prefix)
{
	char q[256];
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
				"member '%s' is not a .npy array (numpy.savez names them NAME.npy)",
				td_file_esc(st.name, q, sizeof(q)));
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
	char q[256], skip[4096];
	zip_file_t *f;
	int64_t got = 0;
	uint64_t off;
	int rc = 0;

	if (!(f = zopen(cp, a)))
		return -EIO;
	/* Past the header again (inflating it), then the data straight into the tensor. */
	for (off = 0; off < a->offset && rc == 0; off += (uint64_t)got) {
		got = zread(cp, f, a, skip,
			    a->offset - off < sizeof(skip) ? a->offset - off : sizeof(skip), false);
		rc = got <= 0 ? (got < 0 ? (int)got : -ENODATA) : 0;
	}
	if (rc == 0) {
		got = zread(cp, f, a, dst, a->nbytes, true);
		if (got >= 0 && (uint64_t)got < a->nbytes)
			got = fail(cp, -ENODATA,
				   "member '%s': truncated: expected %" PRIu64
				   " data bytes, the member has %lld",
				   aq(a->array, q, sizeof(q)), a->nbytes, (long long)got);
		rc = got < 0 ? (int)got : 0;
	}
	/* To its end, so that libzip checks the member's CRC. */
	while (rc == 0 && (got = zread(cp, f, a, skip, sizeof(skip), false)) > 0)
		;
	if (rc == 0 && got < 0)
		rc = (int)got;
	zip_fclose(f);
	if (rc == -ENODATA && !cp->err[0])
		fail(cp, rc, "member '%s': truncated", aq(a->array, q, sizeof(q)));
	return rc;
}

/* --- .safetensors: jansson ----------------------------------------------------------- */

/* One entry {"dtype", "shape", "data_offsets"} of the header into a. */
static int st_entry(struct checkpoint *cp, struct array *a, json_t *e)
{
	json_t *dt = json_object_get(e, "dtype"), *sh = json_object_get(e, "shape"),
	       *off = json_object_get(e, "data_offsets"), *v;
	uint64_t begin, end, count = 1;
	char q[256], dq[64];
	const char *arr = aq(a->array, q, sizeof(q));
	size_t i;

	if (!json_is_object(e) || !json_is_string(dt) || !json_is_array(sh) || !json_is_array(off))
		return fail(
			cp, -EINVAL,
			"array '%s': not an object with \"dtype\", \"shape\" and \"data_offsets\"",
			arr);
	if (td_st_dtype_parse(json_string_value(dt), &a->dtype) < 0)
		return fail(cp, -ENOTSUP, "array '%s': unsupported dtype '%s'", arr,
			    td_file_esc(json_string_value(dt), dq, sizeof(dq)));
	if (json_array_size(sh) > TENSORD_NDIM_MAX)
		return fail(cp, -EINVAL, "array '%s': %zu dimensions (at most %d)", arr,
			    json_array_size(sh), TENSORD_NDIM_MAX);
	a->ndim = (int32_t)json_array_size(sh);
	json_array_foreach(sh, i, v)
	{
		if (!json_is_integer(v) || json_integer_value(v) < 0)
			return fail(cp, -EINVAL, "array '%s': shape holds %s", arr,
				    json_is_integer(v) ? "a negative extent" : "a non-integer");
		a->shape[i] = json_integer_value(v);
		if (a->shape[i] && count > UINT64_MAX / (uint64_t)a->shape[i])
			return fail(cp, -EINVAL, "array '%s': shape overflows", arr);
		count *= (uint64_t)a->shape[i];
	}
	if (count > UINT64_MAX / 64)
		return fail(cp, -EINVAL, "array '%s': shape overflows", arr);
	/* F6 and F4 pack their values: the array must fill whole bytes, as the crate checks. */
	if (count * a->dtype.bits % 8)
		return fail(cp, -EINVAL,
			    "array '%s': %" PRIu64 " values of %u bits are not a whole number of "
			    "bytes",
			    arr, count, a->dtype.bits);
	/* F4 as torch holds it: float4_e2m1fn_x2, two values an element, half the extent. */
	if (a->dtype.bits == 4 && a->ndim > 0 && a->shape[a->ndim - 1] % 2 == 0) {
		a->dtype.lanes = 2;
		a->shape[a->ndim - 1] /= 2;
	}
	if (json_array_size(off) != 2 || !json_is_integer(json_array_get(off, 0)) ||
	    !json_is_integer(json_array_get(off, 1)) ||
	    json_integer_value(json_array_get(off, 0)) < 0 ||
	    json_integer_value(json_array_get(off, 1)) < 0)
		return fail(cp, -EINVAL, "array '%s': data_offsets is not [BEGIN, END]", arr);
	begin = (uint64_t)json_integer_value(json_array_get(off, 0));
	end = (uint64_t)json_integer_value(json_array_get(off, 1));
	if (begin > end)
		return fail(cp, -EINVAL,
			    "array '%s': data_offsets [%" PRIu64 ", %" PRIu64
			    "] end before they begin",
			    arr, begin, end);
	if (end - begin != count * a->dtype.bits / 8)
		return fail(cp, -EINVAL,
			    "array '%s': data_offsets span %" PRIu64
			    " bytes, its dtype and shape need %" PRIu64,
			    arr, end - begin, count * a->dtype.bits / 8);
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
	/* What a file given the wrong suffix most likely is. */
	if (memcmp(le, "PK\x03\x04", 4) == 0)
		return fail(cp, -EINVAL,
			    "not a safetensors file: it is a zip archive (an .npz? name it .npz)");
	if (memcmp(le, NPY_MAGIC, NPY_MAGIC_LEN) == 0)
		return fail(cp, -EINVAL, "not a safetensors file: it is a .npy file");
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
		char q[256];

		rc = fail(cp, -EINVAL, "malformed header: %s",
			  root ? "not a JSON object" : td_file_esc(jerr.text, q, sizeof(q)));
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
		if (!a || (rc = st_entry(cp, a, e)) < 0) {
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
		char q[256];

		if (cp->v[i].offset != at) {
			rc = fail(cp, -EINVAL,
				  "array '%s': data_offsets begin at %" PRIu64 ", expected %" PRIu64
				  " (arrays must tile the data without gaps or overlaps)",
				  aq(cp->v[i].array, q, sizeof(q)), cp->v[i].offset, at);
			goto out;
		}
		at += cp->v[i].nbytes;
	}
	/* A file that ends before the data its header describes was cut short. */
	if (at > data_len) {
		rc = fail(cp, -ENODATA,
			  "truncated: expected %" PRIu64
			  " data bytes after the header, the file has %" PRIu64,
			  at, data_len);
		goto out;
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

/* pread() of a's bytes (.safetensors and .npy alike). */
static int fd_read(struct checkpoint *cp, const struct array *a, void *dst)
{
	uint64_t got;
	ssize_t r;
	char q[256];

	for (got = 0; got < a->nbytes; got += (uint64_t)r) {
		size_t want = a->nbytes - got < CHUNK ? a->nbytes - got : CHUNK;

		r = pread(cp->fd, (char *)dst + got, want, (off_t)(a->offset + got));
		if (r < 0 && errno == EINTR)
			r = 0;
		else if (r < 0)
			return fail(cp, -errno, "array '%s': read error: %s",
				    aq(a->array, q, sizeof(q)), strerror(errno));
		else if (r == 0 && cp->single)
			return fail(cp, -ENODATA,
				    "file shrank while reading (%" PRIu64 " of %" PRIu64 " bytes)",
				    got, a->nbytes);
		else if (r == 0)
			return fail(cp, -ENODATA,
				    "array '%s': file shrank while reading (%" PRIu64 " of %" PRIu64
				    " bytes)",
				    aq(a->array, q, sizeof(q)), got, a->nbytes);
		advance(cp, (uint64_t)r);
	}
	return 0;
}

/* --- .npy: one array, named prefix ---------------------------------------------------- */

static int npy_scan(struct checkpoint *cp, const char *name)
{
	struct npy_header h;
	struct array *a;
	char why[256];
	int rc;

	rc = npy_open_fd(cp->fd, &h, why, sizeof(why));
	if (rc < 0)
		return fail(cp, rc, "%s", why);
	if (strlen(name) > TENSORD_NAME_MAX)
		return fail(cp, -EINVAL, "the name is over 255 bytes");
	if (!(a = grow(cp)))
		return -ENOMEM;
	cp->single = true;
	if (!(a->array = strdup(name)))
		return fail(cp, -ENOMEM, "out of memory");
	snprintf(a->name, sizeof(a->name), "%s", name);
	array_from_npy(a, &h);
	return 0;
}

/* --- the transaction ------------------------------------------------------------------ */

/* Sets the calling thread's error to "PATH: what cp->err says"; returns cp->rc. */
static int file_error(struct checkpoint *cp)
{
	return td_set_error(cp->rc ? cp->rc : -EINVAL, "%s: %s", cp->path, cp->err);
}

/* Creates every array as a member of one transaction and commits it. */
static int publish_all(tensord_client *c, struct checkpoint *cp, read_fn *read_data,
		       uint64_t *ret_commit)
{
	const tensord_file_options *o = cp->opts;
	int64_t strides[TENSORD_NDIM_MAX];
	DLManagedTensorVersioned *t;
	const char *f = cp->path;
	char why[512];
	tensord_tx *tx;
	int rc;

	rc = tensord_tx_begin(c, &tx);
	if (rc < 0)
		return rc;
	for (size_t i = 0; i < cp->n; i++)
		cp->total += cp->v[i].nbytes;
	for (size_t i = 0; i < cp->n; i++) {
		const struct array *ar = &cp->v[i];
		tensord_spec spec = { .dtype = ar->dtype,
				      .ndim = ar->ndim,
				      .shape = ar->ndim ? ar->shape : NULL,
				      .device = { kDLCPU, 0 },
				      /* Into this writer's recycled memory where it has
				       * some (docs/recycle.md): every byte is written. */
				      .flags = (o ? o->flags : 0) | TENSORD_RECYCLE,
				      .mode = o ? o->mode : 0 };
		struct npy_header h = { .fortran_order = ar->fortran, .ndim = ar->ndim };

		if (ar->fortran && ar->ndim > 1 && ar->nbytes > 0) {
			memcpy(h.shape, ar->shape, sizeof(h.shape));
			npy_header_strides(&h, strides);
			spec.strides = strides;
		}
		rc = tensord_tx_create(tx, ar->name, &spec, &t);
		if (rc < 0) {
			char q[256];

			snprintf(why, sizeof(why), "%s", tensord_last_error());
			tensord_tx_free(tx);
			aq(ar->name, q, sizeof(q));
			if (rc == -EEXIST && !(spec.flags & TENSORD_REPLACE))
				return td_set_error(rc,
						    "%s%stensor '%s' already exists (to replace "
						    "tensors you own: tensorctl put --force, "
						    "put_file(..., replace=True), TENSORD_REPLACE)",
						    cp->single ? "" : f, cp->single ? "" : ": ", q);
			/* A .npy's one tensor is named by the caller: the daemon's word, as a put's. */
			if (cp->single)
				return td_set_error(rc, "%s", why[0] ? why : tensord_strerror(rc));
			return td_set_error(rc, "%s: tensor '%s': %s", f, q,
					    why[0] ? why : tensord_strerror(rc));
		}
		rc = ar->nbytes ? read_data(cp, ar,
					    (char *)t->dl_tensor.data + t->dl_tensor.byte_offset)
				: 0;
		/* The member is the transaction's; this lease is only for writing it. */
		t->deleter(t);
		if (rc < 0) {
			tensord_tx_free(tx); /* aborts: nothing of it shows */
			return file_error(cp);
		}
	}
	rc = tensord_tx_commit(tx, ret_commit);
	snprintf(why, sizeof(why), "%s", rc < 0 ? tensord_last_error() : "");
	tensord_tx_free(tx);
	if (rc < 0)
		return td_set_error(rc, "%s: commit: %s", f, why[0] ? why : tensord_strerror(rc));
	return 0;
}

/* The names of cp, in one block the caller frees with free(). */
static int names_block(struct checkpoint *cp, char ***ret_names)
{
	size_t size = (cp->n + 1) * sizeof(char *);
	char **v, *p;

	for (size_t i = 0; i < cp->n; i++)
		size += strlen(cp->v[i].name) + 1;
	v = malloc(size);
	if (!v)
		return td_set_error(-ENOMEM, "out of memory");
	p = (char *)(v + cp->n + 1);
	for (size_t i = 0; i < cp->n; i++) {
		size_t len = strlen(cp->v[i].name) + 1;

		v[i] = memcpy(p, cp->v[i].name, len);
		p += len;
	}
	v[cp->n] = NULL;
	*ret_names = v;
	return 0;
}

/* Opens path for reading, refusing what is not a regular file before it can block. */
static int open_file(struct checkpoint *cp)
{
	struct stat st;
	char why[256];
	int fd;

	/* A FIFO or a device is refused before open(), which could block or act on it;
	 * the descriptor (opened non-blocking) is checked again, in case of a swap. */
	if (stat(cp->path, &st) < 0)
		return fail(cp, -errno, "%s", strerror(errno));
	if (npy_regular(&st, why, sizeof(why)) < 0)
		return fail(cp, -EINVAL, "%s", why);
	fd = open(cp->path, O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
	if (fd < 0)
		return fail(cp, -errno, "%s", strerror(errno));
	if (fstat(fd, &st) < 0) {
		int rc = -errno;

		close(fd);
		return fail(cp, rc, "%s", strerror(-rc));
	}
	if (npy_regular(&st, why, sizeof(why)) < 0) {
		close(fd);
		return fail(cp, -EINVAL, "%s", why);
	}
	fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) & ~O_NONBLOCK);
	cp->fd = fd;
	return 0;
}

int tensord_put_file(tensord_client *client, const char *prefix, const char *path,
		     const tensord_file_options *opts, uint64_t *ret_commit, char ***ret_names,
		     size_t *ret_n)
{
	struct checkpoint cp = { .path = path, .fd = -1, .opts = opts };
	tensord_file_format fmt;
	uint64_t commit = 0;
	char q[256];
	int rc;

	td_clear_error();
	if (!client || !prefix || !path)
		return td_set_error(-EINVAL, "put_file: client, prefix and path are required");
	fmt = opts && opts->format ? opts->format : td_file_format(path);
	if (fmt < TENSORD_FILE_NPY || fmt > TENSORD_FILE_SAFETENSORS)
		return td_set_error(
			-EINVAL, "%s: not a checkpoint tensord reads (.safetensors, .npz or .npy)",
			path);
	if (fmt != TENSORD_FILE_NPY && (rc = td_prefix_check(prefix, path, false)) < 0)
		return rc;
	rc = open_file(&cp);
	if (rc == 0)
		rc = fmt == TENSORD_FILE_NPZ           ? npz_scan(&cp, prefix)
		     : fmt == TENSORD_FILE_SAFETENSORS ? st_scan(&cp, prefix)
						       : npy_scan(&cp, prefix);
	if (rc == 0 && cp.n == 0)
		rc = fail(&cp, -ENOENT, "holds no arrays");
	if (rc == 0) {
		if (cp.n > 1)
			qsort(cp.v, cp.n, sizeof(*cp.v), by_name);
		for (size_t i = 1; i < cp.n && rc == 0; i++)
			if (strcmp(cp.v[i - 1].name, cp.v[i].name) == 0)
				rc = fail(&cp, -EINVAL, "array '%s' is there twice",
					  aq(cp.v[i].array, q, sizeof(q)));
	}
	rc = rc < 0 ? file_error(&cp)
		    : publish_all(client, &cp, fmt == TENSORD_FILE_NPZ ? npz_read : fd_read,
				  &commit);
	if (rc == 0 && ret_names)
		rc = names_block(&cp, ret_names);
	if (rc == 0) {
		if (ret_commit)
			*ret_commit = commit;
		if (ret_n)
			*ret_n = cp.n;
	}
	for (size_t i = 0; i < cp.n; i++)
		free(cp.v[i].array);
	free(cp.v);
	if (cp.zip)
		zip_discard(cp.zip);
	if (cp.fd >= 0)
		close(cp.fd);
	return rc;
}
