#include "frame.h"

#include <assert.h>
#include <errno.h>

#include <tensord/tensord.h>

static uint32_t get_le32(const uint8_t *p)
{
	return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static uint16_t get_le16(const uint8_t *p)
{
	return (uint16_t)(p[0] | p[1] << 8);
}

long td_frame_parse(const uint8_t *buf, size_t len, uint32_t max_len, unsigned max_fds,
		    struct td_frame *ret_frame)
{
	struct td_frame f = { 0 };

	if (len < TD_FRAME_HEADER) {
		if (ret_frame)
			*ret_frame = f;
		return 0;
	}
	f.len = get_le32(buf);
	f.version = get_le16(buf + 4);
	f.flags = get_le16(buf + 6);
	/* These checks come before we wait for the payload: a peer cannot make
	 * us buffer 4 GiB by announcing it, nor wait for descriptors we would
	 * refuse. */
	if (f.version != TENSORD_PROTOCOL_VERSION)
		return -EPROTO;
	if (f.len > max_len)
		return -EMSGSIZE;
	if (f.flags & TD_FRAME_FLAG_FD)
		f.n_fds = 1 + ((f.flags & TD_FRAME_FDS_EXTRA) >> TD_FRAME_FDS_SHIFT);
	else if (f.flags & TD_FRAME_FDS_EXTRA)
		return -ETOOMANYREFS;
	if (f.n_fds > max_fds)
		return -ETOOMANYREFS;
	if (len - TD_FRAME_HEADER >= f.len)
		f.payload = buf + TD_FRAME_HEADER;
	if (ret_frame)
		*ret_frame = f;
	return f.payload ? (long)(TD_FRAME_HEADER + f.len) : 0;
}

void td_frame_header(uint8_t out[TD_FRAME_HEADER], uint32_t payload_len, unsigned n_fds)
{
	uint16_t flags = 0;

	assert(n_fds <= TD_FRAME_FDS_COUNTABLE);
	if (n_fds)
		flags = (uint16_t)(TD_FRAME_FLAG_FD | (n_fds - 1) << TD_FRAME_FDS_SHIFT);
	out[0] = (uint8_t)payload_len;
	out[1] = (uint8_t)(payload_len >> 8);
	out[2] = (uint8_t)(payload_len >> 16);
	out[3] = (uint8_t)(payload_len >> 24);
	out[4] = (uint8_t)TENSORD_PROTOCOL_VERSION;
	out[5] = (uint8_t)(TENSORD_PROTOCOL_VERSION >> 8);
	out[6] = (uint8_t)flags;
	out[7] = (uint8_t)(flags >> 8);
}
