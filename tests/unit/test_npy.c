/*
 * Unit tests for client/lib/npy*.c: header parsing of every format version and
 * dtype, Fortran order, 0-d and zero-size arrays, each refused variant and
 * its message, and write -> read round trips with strided tensors. Files
 * are made here, in memory or in tmpfile()s; nothing binary is committed.
 *
 * npy*.c are internal to libtensord (its checkpoint files), so they are
 * compiled into this test directly, as h2o's unit tests do.
 */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "client/lib/npy.h"

/* Builds preamble + text (padded to 64 bytes) for a given version into buf. */
static size_t mk(uint8_t major, const char *text, uint8_t *buf, size_t len)
{
	size_t pre = major == 1 ? 10 : 12;
	size_t n = strlen(text);
	size_t total = pre + n + 1;
	size_t hlen;

	total += (64 - total % 64) % 64;
	assert_true(total <= len);
	memcpy(buf, NPY_MAGIC, 6);
	buf[6] = major;
	buf[7] = 0;
	hlen = total - pre;
	buf[8] = hlen & 0xff;
	buf[9] = (hlen >> 8) & 0xff;
	if (major != 1) {
		buf[10] = (hlen >> 16) & 0xff;
		buf[11] = (hlen >> 24) & 0xff;
	}
	memcpy(buf + pre, text, n);
	memset(buf + pre + n, ' ', total - pre - n - 1);
	buf[total - 1] = '\n';
	return total;
}

/* Parses a header built from text; returns the rc, the header and the message. */
static int parse_text(uint8_t major, const char *text, struct npy_header *h, char *err)
{
	uint8_t buf[4096];
	size_t n = mk(major, text, buf, sizeof(buf));

	err[0] = '\0';
	return npy_parse_header(buf, n, h, err, 256);
}

static void test_versions(void **state)
{
	struct npy_header h;
	char err[256];
	uint8_t v;

	for (v = 1; v <= 3; v++) {
		assert_int_equal(
			parse_text(v, "{'descr': '<f4', 'fortran_order': False, 'shape': (3, 4), }",
				   &h, err),
			0);
		assert_int_equal(h.version_major, v);
		assert_int_equal(h.dtype.code, kDLFloat);
		assert_int_equal(h.dtype.bits, 32);
		assert_int_equal(h.dtype.lanes, 1);
		assert_int_equal(h.ndim, 2);
		assert_int_equal(h.shape[0], 3);
		assert_int_equal(h.shape[1], 4);
		assert_int_equal(h.count, 12);
		assert_int_equal(h.data_bytes, 48);
		assert_int_equal(h.data_offset % 64, 0);
		assert_false(h.fortran_order);
	}
	/* Keys in another order, double quotes, Python 2 longs, no trailing comma. */
	assert_int_equal(
		parse_text(2, "{\"shape\": (5L,), \"fortran_order\": True, \"descr\": \"<i8\"}", &h,
			   err),
		0);
	assert_int_equal(h.ndim, 1);
	assert_int_equal(h.shape[0], 5);
	assert_true(h.fortran_order);
	assert_int_equal(h.itemsize, 8);
}

static void test_dtypes(void **state)
{
	static const struct {
		const char *descr;
		uint8_t code, bits;
	} cases[] = {
		{ "|b1", kDLBool, 8 },       { "bool", kDLBool, 8 },      { "|i1", kDLInt, 8 },
		{ "<i1", kDLInt, 8 },        { ">i1", kDLInt, 8 },        { "<i2", kDLInt, 16 },
		{ "<i4", kDLInt, 32 },       { "<i8", kDLInt, 64 },       { "|u1", kDLUInt, 8 },
		{ "<u2", kDLUInt, 16 },      { "<u4", kDLUInt, 32 },      { "<u8", kDLUInt, 64 },
		{ "<f2", kDLFloat, 16 },     { "<f4", kDLFloat, 32 },     { "<f8", kDLFloat, 64 },
		{ "<c8", kDLComplex, 64 },   { "<c16", kDLComplex, 128 }, { "=f4", kDLFloat, 32 },
		{ "float64", kDLFloat, 64 }, { "|?", kDLBool, 8 },
	};
	char text[128], err[256], back[16];
	struct npy_header h;
	size_t i;

	for (i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		snprintf(text, sizeof(text),
			 "{'descr': '%s', 'fortran_order': False, 'shape': (2,), }",
			 cases[i].descr);
		assert_int_equal(parse_text(1, text, &h, err), 0);
		assert_int_equal(h.dtype.code, cases[i].code);
		assert_int_equal(h.dtype.bits, cases[i].bits);
		assert_int_equal(h.data_bytes, 2 * cases[i].bits / 8);
		/* And back: the canonical spelling numpy itself writes. */
		assert_int_equal(npy_descr_format(h.dtype, back, sizeof(back), err, sizeof(err)),
				 0);
		assert_int_equal(npy_descr_parse(back, &h.dtype, err, sizeof(err)), 0);
		assert_int_equal(h.dtype.bits, cases[i].bits);
		if (cases[i].bits == 8)
			assert_int_equal(back[0], '|');
		else
			assert_int_equal(back[0], '<');
	}
}

static void test_fortran(void **state)
{
	int64_t strides[TENSORD_NDIM_MAX];
	struct npy_header h;
	char err[256];

	assert_int_equal(parse_text(1,
				    "{'descr': '<f8', 'fortran_order': True, 'shape': (2, 3, 4), }",
				    &h, err),
			 0);
	assert_true(h.fortran_order);
	npy_header_strides(&h, strides);
	assert_int_equal(strides[0], 1);
	assert_int_equal(strides[1], 2);
	assert_int_equal(strides[2], 6);
	h.fortran_order = false;
	npy_header_strides(&h, strides);
	assert_int_equal(strides[0], 12);
	assert_int_equal(strides[1], 4);
	assert_int_equal(strides[2], 1);
}

static void test_zero_d_and_zero_size(void **state)
{
	struct npy_header h;
	char err[256];

	assert_int_equal(
		parse_text(1, "{'descr': '<i4', 'fortran_order': False, 'shape': (), }", &h, err),
		0);
	assert_int_equal(h.ndim, 0);
	assert_int_equal(h.count, 1);
	assert_int_equal(h.data_bytes, 4);

	assert_int_equal(parse_text(1,
				    "{'descr': '<f4', 'fortran_order': False, 'shape': (0, 3), }",
				    &h, err),
			 0);
	assert_int_equal(h.ndim, 2);
	assert_int_equal(h.count, 0);
	assert_int_equal(h.data_bytes, 0);
}

/* Each refused variant: its code and a word of its message. */
static void test_refusals(void **state)
{
	static const struct {
		const char *text;
		int rc;
		const char *says;
	} cases[] = {
		{ "{'descr': '>f4', 'fortran_order': False, 'shape': (2,), }", -ENOTSUP,
		  "big-endian" },
		{ "{'descr': '>c16', 'fortran_order': False, 'shape': (2,), }", -ENOTSUP,
		  "big-endian" },
		{ "{'descr': '|O', 'fortran_order': False, 'shape': (2,), }", -ENOTSUP, "pickled" },
		{ "{'descr': '|S10', 'fortran_order': False, 'shape': (2,), }", -ENOTSUP,
		  "string" },
		{ "{'descr': '<U5', 'fortran_order': False, 'shape': (2,), }", -ENOTSUP, "string" },
		{ "{'descr': '|V8', 'fortran_order': False, 'shape': (2,), }", -ENOTSUP, "void" },
		{ "{'descr': '<M8[ns]', 'fortran_order': False, 'shape': (2,), }", -ENOTSUP,
		  "datetime" },
		{ "{'descr': '<f16', 'fortran_order': False, 'shape': (2,), }", -ENOTSUP,
		  "long double" },
		{ "{'descr': '<x4', 'fortran_order': False, 'shape': (2,), }", -ENOTSUP, "'<x4'" },
		{ "{'descr': [('a', '<f4'), ('b', '<i4')], 'fortran_order': False, 'shape': (2,), "
		  "}",
		  -ENOTSUP, "structured" },
		{ "{'descr': '<f4', 'fortran_order': False, }", -EINVAL, "missing key 'shape'" },
		{ "{'descr': '<f4', 'fortran_order': 0, 'shape': (2,), }", -EINVAL,
		  "fortran_order" },
		{ "{'descr': '<f4', 'fortran_order': False, 'shape': (-2,), }", -EINVAL, "shape" },
		{ "{'descr': '<f4', 'fortran_order': False, 'shape': [2], }", -EINVAL, "tuple" },
		{ "{'descr': '<f4', 'fortran_order': False, 'shape': (2,), 'x': 1}", -EINVAL,
		  "unexpected key 'x'" },
		{ "{'descr': '<f4', 'fortran_order': False, 'shape': (2,), } junk", -EINVAL,
		  "after" },
		{ "['descr']", -EINVAL, "dict" },
		{ "{'descr': '<f4', 'fortran_order': False, 'shape': (4294967296, 4294967296, "
		  "4294967296), }",
		  -EINVAL, "overflow" },
	};
	struct npy_header h;
	char err[256];
	size_t i;

	for (i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		int rc = parse_text(1, cases[i].text, &h, err);

		if (rc != cases[i].rc || !strstr(err, cases[i].says))
			fail_msg("%s: rc %d, message \"%s\"", cases[i].text, rc, err);
		assert_null(strchr(err, '\n'));
	}
}

static void test_too_many_dims(void **state)
{
	char text[512] = "{'descr': '<f4', 'fortran_order': False, 'shape': (";
	struct npy_header h;
	char err[256];
	int i;

	for (i = 0; i < 33; i++)
		strcat(text, "1, ");
	strcat(text, "), }");
	assert_int_equal(parse_text(1, text, &h, err), -ENOTSUP);
	assert_non_null(strstr(err, "dimensions"));
}

static void test_preamble(void **state)
{
	uint8_t buf[4096];
	struct npy_header h;
	char err[256];
	size_t n;

	n = mk(1, "{'descr': '<f4', 'fortran_order': False, 'shape': (2,), }", buf, sizeof(buf));

	/* Bad magic. */
	buf[1] = 'X';
	assert_int_equal(npy_parse_header(buf, n, &h, err, sizeof(err)), -EINVAL);
	assert_non_null(strstr(err, "bad magic"));
	buf[1] = 'N';

	/* Unknown version. */
	buf[6] = 4;
	assert_int_equal(npy_parse_header(buf, n, &h, err, sizeof(err)), -ENOTSUP);
	assert_non_null(strstr(err, "version 4.0"));
	buf[6] = 1;

	/* Cut inside the preamble, and inside the header text. */
	assert_int_equal(npy_parse_header(buf, 4, &h, err, sizeof(err)), -ENODATA);
	assert_non_null(strstr(err, "truncated"));
	assert_int_equal(npy_parse_header(buf, 40, &h, err, sizeof(err)), -ENODATA);
	assert_non_null(strstr(err, "truncated"));

	/* Header too long: a 2.0 preamble announcing 1 MiB. */
	buf[6] = 2;
	buf[8] = 0;
	buf[9] = 0;
	buf[10] = 0x10;
	buf[11] = 0;
	assert_int_equal(npy_parse_header(buf, n, &h, err, sizeof(err)), -EMSGSIZE);
	assert_non_null(strstr(err, "too long"));

	/* An empty buffer is a truncated file, not a crash. */
	assert_int_equal(npy_header_size(buf, 0, err, sizeof(err)), -ENODATA);
}

static void test_format_header(void **state)
{
	static const char want[] = "{'descr': '<f4', 'fortran_order': False, 'shape': (3, 4), }";
	int64_t shape[2] = { 3, 4 }, one = 7;
	struct npy_header h;
	char buf[4096], err[256];
	int n;

	n = npy_format_header((DLDataType){ kDLFloat, 32, 1 }, 2, shape, false, buf, sizeof(buf),
			      err, sizeof(err));
	assert_true(n > 0);
	assert_int_equal(n % 64, 0);
	assert_memory_equal(buf + 10, want, sizeof(want) - 1);
	assert_int_equal(buf[n - 1], '\n');
	assert_int_equal(npy_parse_header(buf, (size_t)n, &h, err, sizeof(err)), 0);
	assert_int_equal(h.data_offset, (uint64_t)n);

	/* 1-tuples keep their comma; 0-d is (). */
	n = npy_format_header((DLDataType){ kDLInt, 64, 1 }, 1, &one, false, buf, sizeof(buf), err,
			      sizeof(err));
	assert_non_null(memmem(buf, (size_t)n, "(7,)", 4));
	n = npy_format_header((DLDataType){ kDLInt, 64, 1 }, 0, NULL, false, buf, sizeof(buf), err,
			      sizeof(err));
	assert_non_null(memmem(buf, (size_t)n, "'shape': ()", 11));

	/* bfloat16 and float8 have no numpy dtype. */
	assert_int_equal(npy_format_header((DLDataType){ kDLBfloat, 16, 1 }, 1, &one, false, buf,
					   sizeof(buf), err, sizeof(err)),
			 -ENOTSUP);
	assert_non_null(strstr(err, "bfloat16"));
	assert_int_equal(npy_format_header((DLDataType){ kDLFloat8_e4m3fn, 8, 1 }, 1, &one, false,
					   buf, sizeof(buf), err, sizeof(err)),
			 -ENOTSUP);
	assert_int_equal(npy_format_header((DLDataType){ kDLFloat, 32, 4 }, 1, &one, false, buf,
					   sizeof(buf), err, sizeof(err)),
			 -ENOTSUP);
}

/* A file read back: its header and its data (malloc'ed, released with unload()). */
struct loaded {
	struct npy_header hdr;
	void *data;
};

static void unload(struct loaded *m)
{
	free(m->data);
	m->data = NULL;
}

/* Writes t to a tmpfile, reads it back; the caller checks and unload()s m. */
static void write_and_read(const DLTensor *t, struct loaded *m)
{
	char err[256];
	FILE *f = tmpfile();

	assert_non_null(f);
	if (npy_write(f, t, err, sizeof(err)) != 0)
		fail_msg("npy_write: %s", err);
	assert_int_equal(fflush(f), 0);
	if (npy_open_fd(fileno(f), &m->hdr, err, sizeof(err)) != 0)
		fail_msg("npy_open_fd: %s", err);
	m->data = malloc(m->hdr.data_bytes + 1);
	assert_non_null(m->data);
	if (npy_read_data(fileno(f), &m->hdr, m->data, err, sizeof(err)) != 0)
		fail_msg("npy_read_data: %s", err);
	fclose(f);
}

static void test_round_trip_contiguous(void **state)
{
	int64_t shape[3] = { 2, 3, 5 };
	struct loaded m;
	DLTensor t = { 0 };
	double v[30];
	int i;

	for (i = 0; i < 30; i++)
		v[i] = i * 1.5 - 7;
	t.data = v;
	t.device = (DLDevice){ kDLCPU, 0 };
	t.ndim = 3;
	t.dtype = (DLDataType){ kDLFloat, 64, 1 };
	t.shape = shape;
	write_and_read(&t, &m);
	assert_int_equal(m.hdr.ndim, 3);
	assert_int_equal(m.hdr.shape[2], 5);
	assert_int_equal(m.hdr.data_bytes, sizeof(v));
	assert_memory_equal(m.data, v, sizeof(v));
	unload(&m);
}

static void test_round_trip_strided(void **state)
{
	int64_t tshape[2] = { 4, 3 }, tstrides[2] = { 1, 4 }; /* a transposed 3x4 */
	int64_t rshape[1] = { 5 }, rstrides[1] = { -2 };      /* every other, reversed */
	int64_t bshape[3] = { 2, 1, 2 },
		bstrides[3] = { 0, 7, 1 }; /* broadcast row, odd unit stride */
	int32_t a[12], out[12];
	struct loaded m;
	DLTensor t = { 0 };
	int i, j;

	for (i = 0; i < 12; i++)
		a[i] = i * 10;
	t.data = a;
	t.device = (DLDevice){ kDLCPU, 0 };
	t.dtype = (DLDataType){ kDLInt, 32, 1 };

	t.ndim = 2;
	t.shape = tshape;
	t.strides = tstrides;
	write_and_read(&t, &m);
	for (i = 0; i < 4; i++)
		for (j = 0; j < 3; j++)
			out[i * 3 + j] = a[j * 4 + i];
	assert_memory_equal(m.data, out, 12 * sizeof(int32_t));
	unload(&m);

	t.ndim = 1;
	t.shape = rshape;
	t.strides = rstrides;
	t.byte_offset = 10 * sizeof(int32_t);
	write_and_read(&t, &m);
	for (i = 0; i < 5; i++)
		out[i] = a[10 - 2 * i];
	assert_memory_equal(m.data, out, 5 * sizeof(int32_t));
	unload(&m);

	t.ndim = 3;
	t.shape = bshape;
	t.strides = bstrides;
	t.byte_offset = 0;
	write_and_read(&t, &m);
	out[0] = a[0];
	out[1] = a[1];
	out[2] = a[0];
	out[3] = a[1];
	assert_memory_equal(m.data, out, 4 * sizeof(int32_t));
	unload(&m);
}

static void test_round_trip_edge(void **state)
{
	int64_t zshape[2] = { 0, 3 };
	uint8_t b = 1;
	struct loaded m;
	DLTensor t = { 0 };

	/* 0-d bool. */
	t.data = &b;
	t.device = (DLDevice){ kDLCPU, 0 };
	t.dtype = (DLDataType){ kDLBool, 8, 1 };
	write_and_read(&t, &m);
	assert_int_equal(m.hdr.ndim, 0);
	assert_int_equal(m.hdr.data_bytes, 1);
	assert_int_equal(*(const uint8_t *)m.data, 1);
	unload(&m);

	/* Zero-size complex, with no data pointer at all. */
	t.data = NULL;
	t.ndim = 2;
	t.shape = zshape;
	t.dtype = (DLDataType){ kDLComplex, 128, 1 };
	write_and_read(&t, &m);
	assert_int_equal(m.hdr.count, 0);
	assert_int_equal(m.hdr.data_bytes, 0);
	assert_string_equal(m.hdr.descr, "<c16");
	unload(&m);
}

static void test_write_refusals(void **state)
{
	int64_t shape[1] = { 2 };
	uint16_t v[2] = { 0 };
	DLTensor t = { 0 };
	char err[256];
	FILE *f = tmpfile();

	t.data = v;
	t.ndim = 1;
	t.shape = shape;
	t.dtype = (DLDataType){ kDLBfloat, 16, 1 };
	t.device = (DLDevice){ kDLCPU, 0 };
	assert_int_equal(npy_write(f, &t, err, sizeof(err)), -ENOTSUP);
	assert_non_null(strstr(err, "bfloat16"));

	t.dtype = (DLDataType){ kDLFloat, 16, 1 };
	t.device = (DLDevice){ kDLCUDA, 0 };
	assert_int_equal(npy_write(f, &t, err, sizeof(err)), -ENOTSUP);
	assert_non_null(strstr(err, "device memory"));
	/* Nothing was written for either. */
	assert_int_equal(ftell(f), 0);
	fclose(f);
}

static void test_open_truncated(void **state)
{
	int64_t shape[1] = { 100 };
	char hdr[4096], err[256];
	struct npy_header h;
	FILE *f = tmpfile();
	int n;

	n = npy_format_header((DLDataType){ kDLFloat, 32, 1 }, 1, shape, false, hdr, sizeof(hdr),
			      err, sizeof(err));
	assert_true(n > 0);
	assert_int_equal(fwrite(hdr, 1, (size_t)n, f), (size_t)n);
	assert_int_equal(fwrite(hdr, 1, 100, f), 100); /* 100 of the 400 data bytes */
	fflush(f);
	assert_int_equal(npy_open_fd(fileno(f), &h, err, sizeof(err)), -ENODATA);
	assert_non_null(strstr(err, "truncated"));
	assert_non_null(strstr(err, "400"));
	fclose(f);

	/* An empty file. */
	f = tmpfile();
	assert_int_equal(npy_open_fd(fileno(f), &h, err, sizeof(err)), -ENODATA);
	assert_non_null(strstr(err, "empty"));
	fclose(f);
}

/* A file cut short after its header was checked: an error that says so, never SIGBUS. */
static void test_read_after_shrink(void **state)
{
	int64_t shape[1] = { 1000 };
	char hdr[4096], err[256];
	float v[1000] = { 0 }, out[1000];
	struct npy_header h;
	FILE *f = tmpfile();
	int n;

	n = npy_format_header((DLDataType){ kDLFloat, 32, 1 }, 1, shape, false, hdr, sizeof(hdr),
			      err, sizeof(err));
	assert_true(n > 0);
	assert_int_equal(fwrite(hdr, 1, (size_t)n, f), (size_t)n);
	assert_int_equal(fwrite(v, 1, sizeof(v), f), sizeof(v));
	fflush(f);
	assert_int_equal(npy_open_fd(fileno(f), &h, err, sizeof(err)), 0);
	assert_int_equal(ftruncate(fileno(f), n + 1000), 0);
	assert_int_equal(npy_read_data(fileno(f), &h, out, err, sizeof(err)), -ENODATA);
	assert_string_equal(err, "file shrank while reading (1000 of 4000 bytes)");
	fclose(f);
}

/* FIFOs, directories and devices are named for what they are, on the stat and on the fd. */
static void test_not_regular(void **state)
{
	struct npy_header h;
	struct stat st;
	char err[256];
	int fd;

	assert_int_equal(stat("/dev/null", &st), 0);
	assert_int_equal(npy_regular(&st, err, sizeof(err)), -EINVAL);
	assert_string_equal(err, "is a character device, not a regular file");
	assert_int_equal(stat("/", &st), 0);
	assert_int_equal(npy_regular(&st, err, sizeof(err)), -EINVAL);
	assert_string_equal(err, "is a directory, not a regular file");
	fd = open("/", O_RDONLY);
	assert_true(fd >= 0);
	assert_int_equal(npy_open_fd(fd, &h, err, sizeof(err)), -EINVAL);
	assert_string_equal(err, "is a directory, not a regular file");
	close(fd);
}

static void test_read_header_file(void **state)
{
	uint8_t buf[4096];
	struct npy_header h;
	char err[256];
	float x = 0;
	size_t n;
	FILE *f = tmpfile();

	n = mk(3, "{'descr': '<f4', 'fortran_order': False, 'shape': (1,), }", buf, sizeof(buf));
	memcpy(buf + n, &(float){ 2.5f }, 4);
	assert_int_equal(fwrite(buf, 1, n + 4, f), n + 4);
	rewind(f);
	assert_int_equal(npy_read_header(f, &h, err, sizeof(err)), 0);
	assert_int_equal(h.version_major, 3);
	assert_int_equal(ftell(f), (long)n);
	assert_int_equal(fread(&x, 4, 1, f), 1);
	assert_true(x == 2.5f);

	fclose(f);

	/* A file that stops inside its header. */
	f = tmpfile();
	assert_int_equal(fwrite(buf, 1, 30, f), 30);
	rewind(f);
	assert_int_equal(npy_read_header(f, &h, err, sizeof(err)), -ENODATA);
	assert_non_null(strstr(err, "truncated"));
	fclose(f);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_versions),
		cmocka_unit_test(test_dtypes),
		cmocka_unit_test(test_fortran),
		cmocka_unit_test(test_zero_d_and_zero_size),
		cmocka_unit_test(test_refusals),
		cmocka_unit_test(test_too_many_dims),
		cmocka_unit_test(test_preamble),
		cmocka_unit_test(test_format_header),
		cmocka_unit_test(test_round_trip_contiguous),
		cmocka_unit_test(test_round_trip_strided),
		cmocka_unit_test(test_round_trip_edge),
		cmocka_unit_test(test_write_refusals),
		cmocka_unit_test(test_open_truncated),
		cmocka_unit_test(test_read_after_shrink),
		cmocka_unit_test(test_not_regular),
		cmocka_unit_test(test_read_header_file),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
