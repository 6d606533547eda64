/*
 * Small pure helpers shared by the GPU backends (daemon) and the GPU
 * importers (client library) of every vendor. No driver calls here, so the
 * unit tests can check them on a machine without a GPU.
 */
#ifndef TENSORD_GPU_UTIL_H
#define TENSORD_GPU_UTIL_H

#include <errno.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "common/vendor.h" /* the vendors, and the stream put() copies on (td_gpu_put_stream()) */

#define TD_GPU_UUID_LEN 16

/* Most devices one process looks at; more are ignored. */
#define TD_GPU_MAX_DEVICES 64

/*
 * Rounds size up to a multiple of gran (any value > 0, not only powers of
 * two: the driver reports the granularity and we do not assume its shape).
 * 0, or -EINVAL for gran == 0, or -EOVERFLOW when the result does not fit.
 */
static inline int td_gpu_round_up(uint64_t size, uint64_t gran, uint64_t *ret)
{
	uint64_t rem, out;

	if (gran == 0)
		return -EINVAL;
	rem = size % gran;
	if (rem == 0) {
		*ret = size;
		return 0;
	}
	if (__builtin_add_overflow(size, gran - rem, &out))
		return -EOVERFLOW;
	*ret = out;
	return 0;
}

/*
 * Finds the local ordinal of the device whose UUID is want, among the n
 * UUIDs of this process's devices (have[i] belongs to ordinal i). Device
 * ordinals differ between processes (CUDA_VISIBLE_DEVICES), the UUID does
 * not. Returns the ordinal, -EINVAL when want is not 16 bytes, -ENODEV when
 * no device matches, -ENOTUNIQ when several do (a driver that reports
 * blank UUIDs: matching on them would pick a GPU at random).
 */
static inline int td_gpu_uuid_find(const uint8_t *want, size_t want_len,
				   const uint8_t (*have)[TD_GPU_UUID_LEN], int n)
{
	int found = -ENODEV;

	if (!want || want_len != TD_GPU_UUID_LEN)
		return -EINVAL;
	for (int i = 0; i < n; i++) {
		if (memcmp(want, have[i], TD_GPU_UUID_LEN) != 0)
			continue;
		if (found >= 0)
			return -ENOTUNIQ;
		found = i;
	}
	return found;
}

/* True when all 16 bytes are zero: drivers use that for "no UUID". */
static inline int td_gpu_uuid_is_blank(const uint8_t uuid[TD_GPU_UUID_LEN])
{
	for (int i = 0; i < TD_GPU_UUID_LEN; i++)
		if (uuid[i])
			return 0;
	return 1;
}

/*
 * Writes uuid as nvidia-smi prints it, "GPU-xxxxxxxx-xxxx-xxxx-xxxx-
 * xxxxxxxxxxxx", so error messages can be matched against `nvidia-smi -L`.
 * buf needs 41 bytes. Returns buf.
 */
static inline const char *td_gpu_uuid_format(const uint8_t *uuid, size_t len, char *buf,
					     size_t buf_len)
{
	const uint8_t *u = uuid;

	if (!uuid || len != TD_GPU_UUID_LEN) {
		snprintf(buf, buf_len, "GPU-(no uuid)");
		return buf;
	}
	snprintf(buf, buf_len,
		 "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%"
		 "02x%02x",
		 u[0], u[1], u[2], u[3], u[4], u[5], u[6], u[7], u[8], u[9], u[10], u[11], u[12],
		 u[13], u[14], u[15]);
	return buf;
}

#endif /* TENSORD_GPU_UTIL_H */
