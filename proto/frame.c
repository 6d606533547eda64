#include "frame.h"

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

long td_frame_parse(const uint8_t *buf, size_t len, uint32_t max_len, struct td_frame *ret_frame)
{
	uint32_t plen;
	uint16_t version;

	if (len < TD_FRAME_HEADER)
		return 0;
	plen = get_le32(buf);
	version = get_le16(buf + 4);
	/* Both checks come before we wait for the payload: a peer cannot make
	 * us buffer 4 GiB by announcing it. */
	if (version != TENSORD_PROTOCOL_VERSION)
		return -EPROTO;
	if (plen > max_len)
		return -EMSGSIZE;
	if (len - TD_FRAME_HEADER < plen)
		return 0;
	if (ret_frame) {
		ret_frame->len = plen;
		ret_frame->version = version;
		ret_frame->flags = get_le16(buf + 6);
		ret_frame->payload = buf + TD_FRAME_HEADER;
	}
	return (long)(TD_FRAME_HEADER + plen);
}

void td_frame_header(uint8_t out[TD_FRAME_HEADER], uint32_t payload_len, uint16_t flags)
{
	out[0] = (uint8_t)payload_len;
	out[1] = (uint8_t)(payload_len >> 8);
	out[2] = (uint8_t)(payload_len >> 16);
	out[3] = (uint8_t)(payload_len >> 24);
	out[4] = (uint8_t)TENSORD_PROTOCOL_VERSION;
	out[5] = (uint8_t)(TENSORD_PROTOCOL_VERSION >> 8);
	out[6] = (uint8_t)flags;
	out[7] = (uint8_t)(flags >> 8);
}
