/*
 * libFuzzer target for the wire layer: the frame parser, the Request,
 * Reply and PeerFrame (proto/peer.proto) decoders, and the descriptor and
 * name checks the daemon runs on what they carry.
 *
 * The input is treated as a byte stream the way conn_process() sees it:
 * frames are cut from the front one after another until the parser wants
 * more bytes or reports an error. Each payload goes through both message
 * decoders, since the daemon decodes requests and the library replies.
 *
 * Build and run: make fuzz (FUZZ_SECONDS=60 by default).
 */
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <tensord/tensord.h>

#include "common/desc.h"
#include "proto/frame.h"
#include "proto/peer.pb-c.h"
#include "proto/tensord.pb-c.h"

/* Invariants the code promises; a broken one is a crash libFuzzer reports. */
#define CHECK(cond)                                                                                \
	do {                                                                                       \
		if (!(cond))                                                                       \
			abort();                                                                   \
	} while (0)

static void check_create(const Tensord__Create *m)
{
	int64_t strides[TENSORD_NDIM_MAX];
	uint64_t nbytes = 0;
	char why[400];
	DLDataType dt;
	int r;

	/* protobuf-c hands back "" for an absent string, never NULL. */
	if (m->name)
		td_name_check(m->name, strlen(m->name), why, sizeof(why));
	if (!m->dtype)
		return;
	/* The daemon range-checks these before narrowing them (dispatch.c). */
	if (m->dtype->code > 255 || m->dtype->bits > 255 || m->dtype->lanes > 65535)
		return;
	dt = (DLDataType){ (uint8_t)m->dtype->code, (uint8_t)m->dtype->bits,
			   (uint16_t)m->dtype->lanes };
	td_dtype_check(dt, why, sizeof(why));
	td_dtype_size(dt);
	if (m->n_shape > TENSORD_NDIM_MAX)
		return;
	if (m->n_strides && m->n_strides != m->n_shape)
		return;
	r = td_layout(dt, (int32_t)m->n_shape, m->shape, m->n_strides ? m->strides : NULL, strides,
		      &nbytes, why, sizeof(why));
	CHECK(r == 0 || r == -EINVAL || r == -EFBIG);
	CHECK(r < 0 || nbytes <= TD_BYTES_MAX);
}

static void check_name(const char *s)
{
	char why[400], q[64];

	if (!s)
		return;
	td_name_check(s, strlen(s), why, sizeof(why));
	td_name_quote(s, strlen(s), q, sizeof(q));
}

/* A peer's frame: the names it carries are checked as the daemon does. */
static void decode_peer(const uint8_t *p, size_t len)
{
	Tensord__PeerFrame *pf = tensord__peer_frame__unpack(NULL, len, p);
	size_t i, n;
	uint8_t *buf;

	if (!pf)
		return;
	switch (pf->body_case) {
	case TENSORD__PEER_FRAME__BODY_HELLO:
		check_name(pf->hello->name);
		break;
	case TENSORD__PEER_FRAME__BODY_PULL:
		check_name(pf->pull->name);
		break;
	case TENSORD__PEER_FRAME__BODY_PULL_REPLY:
		check_name(pf->pull_reply->name);
		break;
	case TENSORD__PEER_FRAME__BODY_SET_PULL:
		check_name(pf->set_pull->prefix);
		for (i = 0; i < pf->set_pull->n_names; i++)
			check_name(pf->set_pull->names[i]);
		break;
	case TENSORD__PEER_FRAME__BODY_CHANGED:
		for (i = 0; i < pf->changed->n_names; i++)
			check_name(pf->changed->names[i]);
		break;
	case TENSORD__PEER_FRAME__BODY_UNWATCH:
		for (i = 0; i < pf->unwatch->n_names; i++)
			check_name(pf->unwatch->names[i]);
		break;
	default:
		break;
	}
	n = tensord__peer_frame__get_packed_size(pf);
	buf = malloc(n ? n : 1);
	if (buf) {
		CHECK(tensord__peer_frame__pack(pf, buf) == n);
		free(buf);
	}
	tensord__peer_frame__free_unpacked(pf, NULL);
}

static void decode(const uint8_t *p, size_t len)
{
	Tensord__Request *req;
	Tensord__Reply *rep;

	req = tensord__request__unpack(NULL, len, p);
	if (req) {
		switch (req->body_case) {
		case TENSORD__REQUEST__BODY_CREATE:
			check_create(req->create);
			break;
		case TENSORD__REQUEST__BODY_ATTACH:
			check_name(req->attach->name);
			break;
		case TENSORD__REQUEST__BODY_STAT:
			check_name(req->stat->name);
			break;
		case TENSORD__REQUEST__BODY_PUBLISH:
			check_name(req->publish->name);
			break;
		case TENSORD__REQUEST__BODY_UNLINK:
			check_name(req->unlink->name);
			break;
		case TENSORD__REQUEST__BODY_PUT:
			if (req->put->create)
				check_create(req->put->create);
			break;
		case TENSORD__REQUEST__BODY_ATTACH_MANY:
			check_name(req->attach_many->prefix);
			for (size_t i = 0; i < req->attach_many->n_names; i++)
				check_name(req->attach_many->names[i]);
			break;
		case TENSORD__REQUEST__BODY_WATCH:
			check_name(req->watch->prefix);
			break;
		case TENSORD__REQUEST__BODY_LIST:
			check_name(req->list->prefix);
			check_name(req->list->after);
			break;
		case TENSORD__REQUEST__BODY_LEASE_LIST:
			check_name(req->lease_list->name);
			break;
		default:
			break;
		}
		/* What the daemon packs must round-trip. */
		size_t n = tensord__request__get_packed_size(req);
		uint8_t *buf = malloc(n ? n : 1);

		if (buf) {
			CHECK(tensord__request__pack(req, buf) == n);
			free(buf);
		}
		tensord__request__free_unpacked(req, NULL);
	}
	decode_peer(p, len);
	rep = tensord__reply__unpack(NULL, len, p);
	if (rep) {
		if (rep->body_case == TENSORD__REPLY__BODY_LEASE && rep->lease->info)
			check_name(rep->lease->info->name);
		tensord__reply__free_unpacked(rep, NULL);
	}
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	size_t off = 0;

	/* Request-sized frames, the daemon's view: no descriptors. */
	while (off < size) {
		struct td_frame f;
		long n = td_frame_parse(data + off, size - off, TD_FRAME_MAX_REQUEST,
					TD_FRAME_MAX_FDS_REQUEST, &f);

		if (n <= 0) {
			/* A frame still arriving: its header is known, or none. */
			CHECK(n < 0 || !f.payload);
			CHECK(n < 0 || f.n_fds == 0);
			break;
		}
		CHECK((size_t)n <= size - off && (size_t)n == TD_FRAME_HEADER + f.len);
		CHECK(f.len <= TD_FRAME_MAX_REQUEST && f.version == TENSORD_PROTOCOL_VERSION);
		CHECK(f.payload == data + off + TD_FRAME_HEADER);
		CHECK(f.n_fds == 0 && !(f.flags & (TD_FRAME_FLAG_FD | TD_FRAME_FDS_EXTRA)));
		decode(f.payload, f.len);
		off += (size_t)n;
	}
	/* The client's limits differ; every count a header can hold parses. */
	td_frame_parse(data, size, TD_FRAME_MAX_REPLY, TD_FRAME_MAX_FDS_REPLY, NULL);
	if (size >= TD_FRAME_HEADER) {
		struct td_frame f;
		long n = td_frame_parse(data, size, TD_FRAME_MAX_REPLY, TD_FRAME_FDS_COUNTABLE, &f);

		CHECK(n != -ETOOMANYREFS || (data[7] && !(data[6] & TD_FRAME_FLAG_FD)));
		CHECK(n < 0 || f.n_fds <= TD_FRAME_FDS_COUNTABLE);
	}
	/* The header it writes parses back, its count included. */
	if (size >= 6) {
		uint8_t hdr[TD_FRAME_HEADER];
		uint32_t plen;
		unsigned n_fds = (data[4] | data[5] << 8) % (TD_FRAME_FDS_COUNTABLE + 1);
		struct td_frame f;

		memcpy(&plen, data, sizeof(plen));
		plen %= TD_FRAME_MAX_REQUEST + 1;
		td_frame_header(hdr, plen, n_fds);
		CHECK(td_frame_parse(hdr, sizeof(hdr), TD_FRAME_MAX_REQUEST, TD_FRAME_FDS_COUNTABLE,
				     &f) == (plen ? 0 : (long)TD_FRAME_HEADER));
		CHECK(f.len == plen && f.n_fds == n_fds);
		/* Up to one descriptor, the bytes a peer without counts wrote. */
		CHECK(n_fds > 1 || (hdr[6] == n_fds && hdr[7] == 0));
	}
	/* The whole input as one payload too, framing aside. */
	decode(data, size);
	return 0;
}
