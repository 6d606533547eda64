/*
 * The GPU vendor table as data, and the questions both sides ask it
 * (vendor.h). Pure: no driver is loaded here, so the descriptor checks
 * and the device names that use it stay free of any GPU library.
 */
#include <string.h>

#include "proto/tensord.pb-c.h" /* the handle kinds of TD_GPU_HANDLES */

#include "vendor.h"

#define VENDOR_ROW(id_, dl, name_, device_, put, streams_, ...)                                    \
	{ .id = #id_,                                                                              \
	  .name = name_,                                                                           \
	  .device = device_,                                                                       \
	  .device_type = kDL##dl,                                                                  \
	  .put_stream = put,                                                                       \
	  .streams = streams_,                                                                     \
	  .host_types = { __VA_ARGS__ } },
#define HANDLE_ROW(id_, kind_, fd_, importer) { #id_, TENSORD__HANDLE_KIND__##kind_, fd_ },

const struct td_gpu_vendor td_gpu_vendors[] = {
	TD_GPU_VENDORS(VENDOR_ROW) /* one per vendor */
	{ NULL },
};

const struct td_gpu_handle td_gpu_handles[] = {
	TD_GPU_HANDLES(HANDLE_ROW) /* one per handle kind */
	{ NULL },
};

#undef VENDOR_ROW
#undef HANDLE_ROW

const struct td_gpu_vendor *td_gpu_vendor_of(int device_type)
{
	for (const struct td_gpu_vendor *v = td_gpu_vendors; v->id; v++)
		if ((int)v->device_type == device_type)
			return v;
	return NULL;
}

const struct td_gpu_vendor *td_gpu_vendor_named(const char *s, const char **ret_rest)
{
	for (const struct td_gpu_vendor *v = td_gpu_vendors; v->id; v++) {
		size_t n = strlen(v->device);

		if (strncmp(s, v->device, n) == 0) {
			*ret_rest = s + n;
			return v;
		}
	}
	return NULL;
}

bool td_gpu_host_type(int device_type)
{
	for (const struct td_gpu_vendor *v = td_gpu_vendors; v->id; v++)
		for (size_t i = 0; i < sizeof(v->host_types) / sizeof(v->host_types[0]); i++)
			if (v->host_types[i] && (int)v->host_types[i] == device_type)
				return true;
	return false;
}

long td_gpu_put_stream(int device_type)
{
	const struct td_gpu_vendor *v = td_gpu_vendor_of(device_type);

	return v ? v->put_stream : TD_GPU_NO_STREAM;
}

bool td_gpu_stream_valid(int device_type, long stream)
{
	const struct td_gpu_vendor *v = td_gpu_vendor_of(device_type);

	if (stream == -1)
		return true;
	if (!v || stream < 0)
		return false;
	return stream > 2 || (v->streams & TD_GPU_STREAM(stream)) != 0;
}

bool td_gpu_handle_fd(int kind)
{
	for (const struct td_gpu_handle *h = td_gpu_handles; h->vendor; h++)
		if (h->kind == kind)
			return h->fd;
	return false;
}

bool td_gpu_handle_ipc(int kind)
{
	for (const struct td_gpu_handle *h = td_gpu_handles; h->vendor; h++)
		if (h->kind == kind)
			return !h->fd;
	return false;
}
