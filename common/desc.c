#include "desc.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/vendor.h"

static bool name_char_ok(unsigned char ch)
{
	return (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') ||
	       ch == '.' || ch == '_' || ch == ':' || ch == '/' || ch == '-';
}

int td_name_check(const char *name, size_t len, char *why, size_t why_len)
{
	if (len == 0) {
		snprintf(why, why_len, "empty name; names are 1 to 255 bytes of [A-Za-z0-9._:/-]");
		return -EINVAL;
	}
	if (len > TENSORD_NAME_MAX) {
		snprintf(why, why_len,
			 "name is %zu bytes; names are 1 to 255 bytes of [A-Za-z0-9._:/-]", len);
		return -EINVAL;
	}
	for (size_t i = 0; i < len; i++) {
		if (!name_char_ok((unsigned char)name[i])) {
			char q[64];

			td_name_quote(name, len, q, sizeof(q));
			if (i == 0 && name[0] == '@')
				snprintf(why, why_len,
					 "name %s names another node's tensor (@PEER/NAME): only "
					 "attach and attach_many take such names (docs/remote.md)",
					 q);
			else
				snprintf(
					why, why_len,
					"name %s has byte 0x%02x at offset %zu; names are 1 to 255 "
					"bytes of [A-Za-z0-9._:/-]",
					q, (unsigned char)name[i], i);
			return -EINVAL;
		}
	}
	return 0;
}

int td_label_check(const char *label, char *why, size_t why_len)
{
	size_t len = strlen(label);

	if (len == 0 || len > TENSORD_LABEL_MAX) {
		snprintf(why, why_len,
			 "client name is %zu bytes; a client name is 1 to %d bytes of printable "
			 "ASCII without spaces",
			 len, TENSORD_LABEL_MAX);
		return -EINVAL;
	}
	for (size_t i = 0; i < len; i++) {
		unsigned char ch = (unsigned char)label[i];

		if (ch <= 0x20 || ch >= 0x7f) {
			snprintf(why, why_len,
				 "client name has byte 0x%02x at offset %zu; a client name is 1 to "
				 "%d bytes of printable ASCII without spaces",
				 ch, i, TENSORD_LABEL_MAX);
			return -EINVAL;
		}
	}
	return 0;
}

int td_remote_name_check(const char *name, size_t len, size_t *ret_peer_len, char *why,
			 size_t why_len)
{
	const char *slash = len > 1 && name[0] == '@' ? memchr(name, '/', len) : NULL;
	size_t peer_len = slash ? (size_t)(slash - name) - 1 : 0;
	char q[64];

	td_name_quote(name, len, q, sizeof(q));
	if (!slash || peer_len == 0 || peer_len > 63) {
		snprintf(why, why_len,
			 "remote name %s is not @PEER/NAME with PEER 1-63 bytes of "
			 "[A-Za-z0-9._-]",
			 q);
		return -EINVAL;
	}
	for (size_t i = 1; i <= peer_len; i++) {
		unsigned char ch = (unsigned char)name[i];

		if (!((ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') ||
		      (ch >= '0' && ch <= '9') || ch == '.' || ch == '_' || ch == '-')) {
			snprintf(why, why_len,
				 "remote name %s: its peer has byte 0x%02x; peers are 1-63 bytes "
				 "of [A-Za-z0-9._-]",
				 q, ch);
			return -EINVAL;
		}
	}
	if (len > TENSORD_NAME_MAX) {
		snprintf(why, why_len, "remote name %s is %zu bytes; at most %d with its @PEER/", q,
			 len, TENSORD_NAME_MAX);
		return -EINVAL;
	}
	if (td_name_check(slash + 1, len - peer_len - 2, why, why_len) < 0)
		return -EINVAL;
	*ret_peer_len = peer_len;
	return 0;
}

const char *td_name_quote(const char *name, size_t len, char *buf, size_t buf_len)
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

int td_dtype_check(DLDataType dt, char *why, size_t why_len)
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

int td_ndim_check(int64_t ndim, size_t n_strides, bool strides_required, char *why, size_t why_len)
{
	if (ndim < 0 || ndim > TENSORD_NDIM_MAX) {
		snprintf(why, why_len, "%lld dimensions; tensors have 0 to %d", (long long)ndim,
			 TENSORD_NDIM_MAX);
		return -EINVAL;
	}
	if ((n_strides || strides_required) && n_strides != (size_t)ndim) {
		snprintf(why, why_len, "%zu strides for %lld dimensions", n_strides,
			 (long long)ndim);
		return -EINVAL;
	}
	return 0;
}

int td_desc_from_wire(uint32_t code, uint32_t bits, uint32_t lanes, size_t n_shape,
		      size_t n_strides, bool strides_required, DLDataType *ret_dt, char *why,
		      size_t why_len)
{
	if (code > UINT8_MAX || bits > UINT8_MAX || lanes > UINT16_MAX || bits == 0 || lanes == 0) {
		snprintf(why, why_len,
			 "dtype(%u,%u,%u) is out of range: code and bits at most 255, lanes "
			 "at most 65535, bits and lanes at least 1",
			 code, bits, lanes);
		return -EINVAL;
	}
	/* A count past INT64_MAX reads as negative: refused as well. */
	if (td_ndim_check((int64_t)n_shape, n_strides, strides_required, why, why_len) < 0)
		return -EINVAL;
	*ret_dt = (DLDataType){ (uint8_t)code, (uint8_t)bits, (uint16_t)lanes };
	return 0;
}

uint64_t td_dtype_size(DLDataType dt)
{
	uint64_t bits = (uint64_t)dt.bits * dt.lanes;

	return bits % 8 ? 0 : bits / 8;
}

int td_layout(DLDataType dt, int32_t ndim, const int64_t *shape, const int64_t *strides,
	      int64_t *ret_strides, uint64_t *ret_nbytes, char *why, size_t why_len)
{
	uint64_t elsize, numel = 1, span = 1;
	unsigned __int128 nbytes;
	int r;

	r = td_dtype_check(dt, why, why_len);
	if (r < 0)
		return r;
	r = td_ndim_check(ndim, 0, false, why, why_len);
	if (r < 0)
		return r;
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
	elsize = td_dtype_size(dt);
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
					 "strides[%d] is %lld; negative strides are not supported",
					 i, (long long)strides[i]);
				return -EINVAL;
			}
			ret_strides[i] = strides[i];
			if (shape[i] == 0)
				continue;
			if (__builtin_mul_overflow((uint64_t)(shape[i] - 1), (uint64_t)strides[i],
						   &step) ||
			    __builtin_add_overflow(span, step, &span)) {
				snprintf(why, why_len, "strides overflow 64 bits at dimension %d",
					 i);
				return -EINVAL;
			}
		}
		nbytes = numel ? (unsigned __int128)span * elsize : 0;
	}
	if (nbytes > TD_BYTES_MAX) {
		snprintf(why, why_len, "tensor needs %s bytes; at most 2^56 are allowed",
			 nbytes > UINT64_MAX ? "more than 2^64" : "more than 2^56");
		return -EFBIG;
	}
	*ret_nbytes = (uint64_t)nbytes;
	return 0;
}

bool td_device_host_accessible(DLDeviceType type)
{
	return type == kDLCPU || td_gpu_host_type(type);
}

bool td_device_is_gpu(DLDeviceType type)
{
	return td_gpu_vendor_of(type) != NULL;
}
