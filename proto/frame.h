/*
 * Frame codec: u32 length | u16 version | u16 flags | payload, little-endian.
 * Pure functions with no I/O, so they are unit-tested and fuzzed directly.
 */
#ifndef TENSORD_FRAME_H
#define TENSORD_FRAME_H

#include <stddef.h>
#include <stdint.h>

#define TD_FRAME_HEADER 8u
/* Flag bit: one file descriptor rides with the first byte of this frame. */
#define TD_FRAME_FLAG_FD (1u << 0)
/* Largest request the daemon accepts: names and shapes are small. */
#define TD_FRAME_MAX_REQUEST (64u * 1024u)
/*
 * Largest reply a client accepts. Replies that could grow with the daemon's
 * state (List, LeaseList, ClientList, Metrics) are paged or bounded far
 * below it; the cap bounds what a broken or hostile daemon can make a
 * client allocate.
 */
#define TD_FRAME_MAX_REPLY (256u * 1024u * 1024u)

struct td_frame {
	uint32_t len; /* payload bytes */
	uint16_t version;
	uint16_t flags;
	const uint8_t *payload; /* borrowed: points into the parsed buffer */
};

/*
 * Looks for one frame at the start of buf. Returns 0 when more bytes are
 * needed, the whole frame's size (header + payload) when one is complete,
 * -EMSGSIZE when its length exceeds max_len (decided from the header alone,
 * before anything is allocated), -EPROTO when its version is not
 * TENSORD_PROTOCOL_VERSION.
 */
long td_frame_parse(const uint8_t *buf, size_t len, uint32_t max_len, struct td_frame *ret_frame);

/* Writes a header for a payload of payload_len bytes into out[8]. */
void td_frame_header(uint8_t out[TD_FRAME_HEADER], uint32_t payload_len, uint16_t flags);

#endif
