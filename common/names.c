/*
 * The names users type for dtypes and devices ("float32", "cuda:1"): the
 * public tensord_dtype_*() and tensord_device_*() functions, shared by the
 * client library, tensorctl and the Python module.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <tensord/tensord.h>

#include "common/desc.h"
#include "common/vendor.h"

/* Names typed by users; the order is the one tensord_dtype_name() prefers. */
static const struct {
	const char *name;
	DLDataType dt;
} dtype_names[] = {
	{ "bool", { kDLBool, 8, 1 } },
	{ "int8", { kDLInt, 8, 1 } },
	{ "int16", { kDLInt, 16, 1 } },
	{ "int32", { kDLInt, 32, 1 } },
	{ "int64", { kDLInt, 64, 1 } },
	{ "uint8", { kDLUInt, 8, 1 } },
	{ "uint16", { kDLUInt, 16, 1 } },
	{ "uint32", { kDLUInt, 32, 1 } },
	{ "uint64", { kDLUInt, 64, 1 } },
	{ "float16", { kDLFloat, 16, 1 } },
	{ "bfloat16", { kDLBfloat, 16, 1 } },
	{ "float32", { kDLFloat, 32, 1 } },
	{ "float64", { kDLFloat, 64, 1 } },
	{ "complex64", { kDLComplex, 64, 1 } },
	{ "complex128", { kDLComplex, 128, 1 } },
	/*
	 * The narrow floats DLPack defines, named as torch names them
	 * (float8_e4m3fn ...) and, for those torch lacks, as ml_dtypes does.
	 * float4_e2m1fn_x2 is torch's: two 4-bit values packed in a byte, the
	 * DLPack type torch exports (17, 4, 2); float4_e2m1fn is one value a
	 * lane, packed two a byte (ml_dtypes' float4_e2m1fn, safetensors' F4).
	 */
	{ "float8_e4m3fn", { kDLFloat8_e4m3fn, 8, 1 } },
	{ "float8_e5m2", { kDLFloat8_e5m2, 8, 1 } },
	{ "float8_e4m3fnuz", { kDLFloat8_e4m3fnuz, 8, 1 } },
	{ "float8_e5m2fnuz", { kDLFloat8_e5m2fnuz, 8, 1 } },
	{ "float8_e8m0fnu", { kDLFloat8_e8m0fnu, 8, 1 } },
	{ "float4_e2m1fn_x2", { kDLFloat4_e2m1fn, 4, 2 } },
	{ "float8_e3m4", { kDLFloat8_e3m4, 8, 1 } },
	{ "float8_e4m3", { kDLFloat8_e4m3, 8, 1 } },
	{ "float8_e4m3b11fnuz", { kDLFloat8_e4m3b11fnuz, 8, 1 } },
	{ "float6_e2m3fn", { kDLFloat6_e2m3fn, 6, 1 } },
	{ "float6_e3m2fn", { kDLFloat6_e3m2fn, 6, 1 } },
	{ "float4_e2m1fn", { kDLFloat4_e2m1fn, 4, 1 } },
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

/* Devices are "cpu" and each GPU vendor's "<device>:N" (common/vendor.h); "<device>" is N = 0. */
int tensord_device_parse(const char *s, DLDevice *ret)
{
	const struct td_gpu_vendor *v;
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
	v = td_gpu_vendor_named(s, &num);
	if (!v)
		return -EINVAL;
	type = v->device_type;
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
	const struct td_gpu_vendor *v = td_gpu_vendor_of(dev.device_type);

	if (dev.device_type == kDLCPU)
		snprintf(buf, len, "cpu");
	else if (v)
		snprintf(buf, len, "%s:%d", v->device, dev.device_id);
	else
		snprintf(buf, len, "device(%d,%d)", (int)dev.device_type, dev.device_id);
	return buf;
}

bool tensord_device_host_accessible(DLDeviceType type)
{
	return td_device_host_accessible(type);
}

bool tensord_device_is_gpu(DLDeviceType type)
{
	return td_device_is_gpu(type);
}

long tensord_put_stream(DLDeviceType type)
{
	return td_gpu_put_stream((int)type);
}

bool tensord_stream_valid(DLDeviceType type, long stream)
{
	return td_gpu_stream_valid((int)type, stream);
}
