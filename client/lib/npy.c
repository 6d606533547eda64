/*
 * NumPy .npy support for tensorctl, the part both directions share: the
 * dtype table and its spellings, and npy_fail(). npy_read.c parses and maps
 * files, npy_write.c formats and writes them. See npy.h for what is handled.
 *
 * The format (numpy/lib/format.py documents it): six magic bytes, a major
 * and a minor version byte, a little-endian header length (u16 in 1.0, u32
 * in 2.0 and 3.0), then the header text, a Python dict literal such as
 * {'descr': '<f4', 'fortran_order': False, 'shape': (3, 4), } padded with
 * spaces and a newline, then the raw elements. 3.0 only differs from 2.0 in
 * allowing UTF-8 in the header, which only structured dtypes use.
 */
#include "npy.h"

#include <errno.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

/* The byte order this host writes; the other one is refused on read. */
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
#define NPY_NATIVE '>'
#else
#define NPY_NATIVE '<'
#endif

int npy_fail(int rc, char *err, size_t errlen, const char *fmt, ...)
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
	{ 'b', 1, kDLBool, "bool" },         { 'i', 1, kDLInt, "int8" },
	{ 'i', 2, kDLInt, "int16" },         { 'i', 4, kDLInt, "int32" },
	{ 'i', 8, kDLInt, "int64" },         { 'u', 1, kDLUInt, "uint8" },
	{ 'u', 2, kDLUInt, "uint16" },       { 'u', 4, kDLUInt, "uint32" },
	{ 'u', 8, kDLUInt, "uint64" },       { 'f', 2, kDLFloat, "float16" },
	{ 'f', 4, kDLFloat, "float32" },     { 'f', 8, kDLFloat, "float64" },
	{ 'c', 8, kDLComplex, "complex64" }, { 'c', 16, kDLComplex, "complex128" },
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
