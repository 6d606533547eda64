/*
 * Frame codec: u32 length | u16 version | u16 flags | payload, little-endian.
 * Pure functions with no I/O, so they are unit-tested and fuzzed directly.
 *
 * Descriptors. The flags count the file descriptors (SCM_RIGHTS) that ride
 * with the frame, as PipeWire's n_fds does: bit 0 (TD_FRAME_FLAG_FD) says
 * there is at least one, and bits 8-15 (TD_FRAME_FDS_EXTRA) how many more
 * than one there are. So
 *
 *	n_fds = (flags & TD_FRAME_FLAG_FD) ? 1 + (flags >> 8) : 0
 *
 * and every count has exactly one encoding. This keeps the header 8 bytes
 * and the wire of 0 and 1 descriptors what it always was: before the count,
 * bit 0 meant "one descriptor", so a frame with one is byte for byte the
 * frame an older daemon sent and an older client reads, and a frame from an
 * older peer counts 0 or 1 here. Only counts above one (which no reply uses
 * yet) would be misread by an older peer. Bits 1-7 are unused and ignored.
 *
 * A sender sends a frame's descriptors with the frame's first byte, in one
 * sendmsg(); a receiver keeps what arrives in one queue, in arrival order,
 * and each frame takes its n_fds from the head of it. A stream socket on
 * Linux never hands one recvmsg() the descriptors of two sendmsg() calls,
 * so a receiver needs control room for one frame's descriptors only.
 */
#ifndef TENSORD_FRAME_H
#define TENSORD_FRAME_H

#include <stddef.h>
#include <stdint.h>

#define TD_FRAME_HEADER 8u
/* Flag bit: descriptors ride with this frame, one plus TD_FRAME_FDS_EXTRA. */
#define TD_FRAME_FLAG_FD (1u << 0)
/* Flag bits 8-15: how many descriptors ride beyond the first. */
#define TD_FRAME_FDS_SHIFT 8
#define TD_FRAME_FDS_EXTRA (0xffu << TD_FRAME_FDS_SHIFT)
/* The most descriptors a header can count. */
#define TD_FRAME_FDS_COUNTABLE 256u
/* Clients never send descriptors. */
#define TD_FRAME_MAX_FDS_REQUEST 0u
/*
 * A reply that hands over memory carries one; a part of an AttachMany
 * reply one per lease it holds at most (daemon/conn.h, CONN_FDS_PER_FRAME).
 */
#define TD_FRAME_MAX_FDS_REPLY 240u
/*
 * Largest request the daemon accepts, and says so in its Hello reply
 * (max_frame): names and shapes are small, but a put of up to 64 KiB
 * carries its bytes inline. Every daemon accepts TD_FRAME_MIN_REQUEST
 * (tensord 0.1 accepted exactly that and said nothing), so a client sends
 * more only to a daemon that said it may.
 */
#define TD_FRAME_MAX_REQUEST (128u * 1024u)
#define TD_FRAME_MIN_REQUEST (64u * 1024u)
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
	uint16_t flags;         /* as sent, the descriptor count included */
	unsigned n_fds;         /* descriptors that ride with the frame */
	const uint8_t *payload; /* borrowed: points into the parsed buffer; NULL until complete */
};

/*
 * Looks for one frame at the start of buf. Returns 0 when more bytes are
 * needed, the whole frame's size (header + payload) when one is complete,
 * or, decided from the header alone before anything is allocated or
 * waited for: -EPROTO when its version is not TENSORD_PROTOCOL_VERSION,
 * -EMSGSIZE when its length exceeds max_len, -ETOOMANYREFS when it counts
 * more descriptors than max_fds (or sets TD_FRAME_FDS_EXTRA without
 * TD_FRAME_FLAG_FD, which counts some in no valid way).
 *
 * ret_frame may be NULL. When the return is 0, ret_frame->payload is NULL
 * and the other fields are the header's if the header is complete (so a
 * caller knows the count of a frame still arriving), else zero.
 */
long td_frame_parse(const uint8_t *buf, size_t len, uint32_t max_len, unsigned max_fds,
		    struct td_frame *ret_frame);

/*
 * Writes the header of a frame of payload_len bytes that n_fds descriptors
 * ride with (at most TD_FRAME_FDS_COUNTABLE) into out[8].
 */
void td_frame_header(uint8_t out[TD_FRAME_HEADER], uint32_t payload_len, unsigned n_fds);

#endif
