#include "desc.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static bool name_char_ok(unsigned char ch)
{
	return (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') ||
	       ch == '.' || ch == '_' || ch == ':' || ch == '/' || ch == '-';
}

int tensord_name_check(const char *name, size_t len, char *why, size_t why_len)
{
	if (len == 0) {
		snprintf(why, why_len, "empty name; names are 1 to 255 bytes of [A-Za-z0-9._:/-]");
		return -EINVAL;
	}
	if (len > TENSORD_NAME_MAX) {
		snprintf(why, why_len, "name is %zu bytes; names are 1 to 255 bytes of [A-Za-z0-9._:/-]",
			 len);
		return -EINVAL;
	}
	for (size_t i = 0; i < len; i++) {
		if (!name_char_ok((unsigned char)name[i])) {
			char q[64];

			tensord_name_quote(name, len, q, sizeof(q));
			snprintf(why, why_len,
				 "name %s has byte 0x%02x at offset %zu; names are 1 to 255 bytes of "
				 "[A-Za-z0-9._:/-]",
				 q, (unsigned char)name[i], i);
			return -EINVAL;
		}
	}
	return 0;
}

const char *tensord_name_quote(const char *name, size_t len, char *buf, size_t buf_len)
{
	size_t o = 0;

	if (buf_len < 8) {
		if (buf_len)
			buf[0] = '\0';
		return buf;
	}
	buf[o++] = '\'';
	for (size_t i = 0; i < len && o + 6 < buf_len; i++) {
		unsigned char ch = (unsigned char)name[i];

		if (ch >= 0x20 && ch < 0x7f && ch != '\'' && ch != '\\')
			buf[o++] = (char)ch;
		else
			o += (size_t)snprintf(buf + o, buf_len - o, "\\x%02x", ch);
	}
	if (o + 5 < buf_len && len > 0 && o < len + 1 && o + 6 >= buf_len)
		buf[o++] = '.';
	buf[o++] = '\'';
	buf[o] = '\0';
	return buf;
}

/* Names typed by users; the order is the one tensord_dtype_name() prefers. */
static const struct {
	const char *name;
	DLDataType dt;
} dtype_names[] = {
	{ "bool", { kDLBool, 8, 1 } },         { "int8", { kDLInt, 8, 1 } },
	{ "int16", { kDLInt, 16, 1 } },        { "int32", { kDLInt, 32, 1 } },
	{ "int64", { kDLInt, 64, 1 } },        { "uint8", { kDLUInt, 8, 1 } },
	{ "uint16", { kDLUInt, 16, 1 } },      { "uint32", { kDLUInt, 32, 1 } },
	{ "uint64", { kDLUInt, 64, 1 } },      { "float16", { kDLFloat, 16, 1 } },
	{ "bfloat16", { kDLBfloat, 16, 1 } },  { "float32", { kDLFloat, 32, 1 } },
	{ "float64", { kDLFloat, 64, 1 } },    { "complex64", { kDLComplex, 64, 1 } },
	{ "complex128", { kDLComplex, 128, 1 } },
};

int tensord_dtype_parse(const char *s, DLDataType *ret)
{
	if (!s)
		return -EINVAL;
	for (size_t i = 0; i < sizeof(dtype_names) / sizeof(dtype_names[0]); i++) {
		if (strcmp(s, dtype_names[i].name) == 0) {
			*ret = dtype_names[i].dt;
			return 0;
		}
	}
	/* Spellings numpy and torch users type. */
	if (strcmp(s, "half") == 0 || strcmp(s, "float") == 0 || strcmp(s, "double") == 0) {
		*ret = (DLDataType){ kDLFloat, s[0] == 'h' ? 16 : s[0] == 'f' ? 32 : 64, 1 };
		return 0;
	}
	return -EINVAL;
}

const char *tensord_dtype_name(DLDataType dt, char *buf, size_t len)
{
	for (size_t i = 0; i < sizeof(dtype_names) / sizeof(dtype_names[0]); i++) {
		const DLDataType *d = &dtype_names[i].dt;

		if (d->code == dt.code && d->bits == dt.bits && d->lanes == dt.lanes) {
			snprintf(buf, len, "%s", dtype_names[i].name);
			return buf;
		}
	}
	snprintf(buf, len, "dtype(%u,%u,%u)", dt.code, dt.bits, dt.lanes);
	return buf;
}

int tensord_device_parse(const char *s, DLDevice *ret)
{
	const char *num;
	char *end;
	long id;
	DLDeviceType type;

	if (!s)
		return -EINVAL;
	if (strcmp(s, "cpu") == 0) {
		*ret = (DLDevice){ kDLCPU, 0 };
		return 0;
	}
	if (strncmp(s, "cuda", 4) == 0) {
		type = kDLCUDA;
		num = s + 4;
	} else if (strncmp(s, "rocm", 4) == 0) {
		type = kDLROCM;
		num = s + 4;
	} else {
		return -EINVAL;
	}
	if (*num == '\0') {
		*ret = (DLDevice){ type, 0 };
		return 0;
	}
	if (*num != ':' || num[1] < '0' || num[1] > '9')
		return -EINVAL;
	errno = 0;
	id = strtol(num + 1, &end, 10);
	if (errno || *end || id < 0 || id > 1023)
		return -EINVAL;
	*ret = (DLDevice){ type, (int32_t)id };
	return 0;
}

const char *tensord_device_name(DLDevice dev, char *buf, size_t len)
{
	switch (dev.device_type) {
	case kDLCPU:
		snprintf(buf, len, "cpu");
		break;
	case kDLCUDA:
		snprintf(buf, len, "cuda:%d", dev.device_id);
		break;
	case kDLROCM:
		snprintf(buf, len, "rocm:%d", dev.device_id);
		break;
	default:
		snprintf(buf, len, "device(%d,%d)", (int)dev.device_type, dev.device_id);
		break;
	}
	return buf;
}

int tensord_dtype_check(DLDataType dt, char *why, size_t why_len)
{
	if (dt.code > kDLFloat4_e2m1fn) {
		snprintf(why, why_len, "unknown dtype code %u (DLPack knows 0 to %u)", dt.code,
			 (unsigned)kDLFloat4_e2m1fn);
		return -EINVAL;
	}
	if (dt.bits == 0 || dt.lanes == 0) {
		snprintf(why, why_len, "dtype(%u,%u,%u) has no size; bits and lanes must be >= 1",
			 dt.code, dt.bits, dt.lanes);
		return -EINVAL;
	}
	if (dt.code == kDLBool && dt.bits != 8) {
		snprintf(why, why_len, "bool must be 8 bits, not %u", dt.bits);
		return -EINVAL;
	}
	if (dt.code == kDLComplex && dt.bits % 2) {
		snprintf(why, why_len, "complex dtypes need an even bit count, not %u", dt.bits);
		return -EINVAL;
	}
	return 0;
}

uint64_t tensord_dtype_size(DLDataType dt)
{
	uint64_t bits = (uint64_t)dt.bits * dt.lanes;

	return bits % 8 ? 0 : bits / 8;
}

int tensord_layout(DLDataType dt, int32_t ndim, const int64_t *shape, const int64_t *strides,
		   int64_t *ret_strides, uint64_t *ret_nbytes, char *why, size_t why_len)
{
	uint64_t elsize, numel = 1, span = 1;
	unsigned __int128 nbytes;
	int r;

	r = tensord_dtype_check(dt, why, why_len);
	if (r < 0)
		return r;
	if (ndim < 0 || ndim > TENSORD_NDIM_MAX) {
		snprintf(why, why_len, "%d dimensions; tensors have 0 to %d", ndim, TENSORD_NDIM_MAX);
		return -EINVAL;
	}
	for (int i = 0; i < ndim; i++) {
		if (shape[i] < 0) {
			snprintf(why, why_len, "shape[%d] is %lld; extents must be >= 0", i,
				 (long long)shape[i]);
			return -EINVAL;
		}
		if (__builtin_mul_overflow(numel, (uint64_t)shape[i], &numel)) {
			snprintf(why, why_len, "shape overflows 64 bits at dimension %d", i);
			return -EINVAL;
		}
	}
	elsize = tensord_dtype_size(dt);
	if (!strides) {
		int64_t acc = 1;

		for (int i = ndim - 1; i >= 0; i--) {
			ret_strides[i] = acc;
			/* numel fits in 64 unsigned bits, but a stride is signed, and a
			 * zero extent hides any product of the others from numel. */
			if (i > 0 && __builtin_mul_overflow(acc, shape[i] ? shape[i] : 1, &acc)) {
				snprintf(why, why_len, "strides overflow 64 bits at dimension %d",
					 i - 1);
				return -EINVAL;
			}
		}
		if (elsize)
			nbytes = (unsigned __int128)numel * elsize;
		else /* packed sub-byte types */
			nbytes = ((unsigned __int128)numel * dt.bits * dt.lanes + 7) / 8;
	} else {
		if (!elsize && numel) {
			snprintf(why, why_len, "explicit strides need a dtype of whole bytes");
			return -EINVAL;
		}
		/* The last element sits at sum((shape[i]-1)*strides[i]); the
		 * allocation must hold it, so strides can never reach outside. */
		for (int i = 0; i < ndim; i++) {
			uint64_t step;

			if (strides[i] < 0) {
				snprintf(why, why_len,
					 "strides[%d] is %lld; negative strides are not supported", i,
					 (long long)strides[i]);
				return -EINVAL;
			}
			ret_strides[i] = strides[i];
			if (shape[i] == 0)
				continue;
			if (__builtin_mul_overflow((uint64_t)(shape[i] - 1), (uint64_t)strides[i],
						   &step) ||
			    __builtin_add_overflow(span, step, &span)) {
				snprintf(why, why_len, "strides overflow 64 bits at dimension %d", i);
				return -EINVAL;
			}
		}
		nbytes = numel ? (unsigned __int128)span * elsize : 0;
	}
	if (nbytes > TENSORD_BYTES_MAX) {
		snprintf(why, why_len, "tensor needs %s bytes; at most 2^56 are allowed",
			 nbytes > UINT64_MAX ? "more than 2^64" : "more than 2^56");
		return -EFBIG;
	}
	*ret_nbytes = (uint64_t)nbytes;
	return 0;
}

/* One table feeds tensord_strerror() and tensord_err_name(). */
#define TENSORD_ERRNO_MAP(XX)                                                   \
	XX(ENOENT, "no such tensor")                                            \
	XX(EEXIST, "tensor exists")                                             \
	XX(EINVAL, "invalid argument")                                          \
	XX(ENOSPC, "over capacity")                                             \
	XX(ENODEV, "no backend for device")                                     \
	XX(EPERM, "operation not permitted")                                    \
	XX(EACCES, "permission denied")                                         \
	XX(ETIMEDOUT, "timed out")                                              \
	XX(EPROTO, "protocol error")                                            \
	XX(ECONNREFUSED, "no daemon at socket")                                 \
	XX(ECONNRESET, "connection to daemon lost")                             \
	XX(EPIPE, "connection to daemon lost")                                  \
	XX(ENOTCONN, "client is closed")                                        \
	XX(EBUSY, "busy: writable mappings remain")                             \
	XX(EMSGSIZE, "message too large")                                       \
	XX(EBADMSG, "malformed message")                                        \
	XX(ENOMEM, "out of memory")                                             \
	XX(EFBIG, "tensor too large")                                           \
	XX(EMFILE, "too many open files")                                       \
	XX(EAGAIN, "resource limit reached, try again")                         \
	XX(ENOTSUP, "not supported")                                            \
	XX(ENAMETOOLONG, "name too long")                                       \
	XX(ESRCH, "no such lease")

const char *tensord_strerror(int err)
{
	if (err < 0)
		err = -err;
	switch (err) {
	case 0:
		return "success";
#define XX(code, msg) \
	case code:    \
		return msg;
		TENSORD_ERRNO_MAP(XX)
#undef XX
	default:
		return "unknown error";
	}
}

const char *tensord_err_name(int err)
{
	if (err < 0)
		err = -err;
	switch (err) {
	case 0:
		return "OK";
#define XX(code, msg) \
	case code:    \
		return #code;
		TENSORD_ERRNO_MAP(XX)
#undef XX
	default:
		return "EUNKNOWN";
	}
}
