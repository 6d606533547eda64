/* Internals of libtensord shared by its files. */
#ifndef TENSORD_CLIENT_H
#define TENSORD_CLIENT_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include <tensord/tensord.h>

#include "import.h"
#include "proto/tensord.pb-c.h"

#define TD_FDQ 8

struct td_pending {
	uint64_t id;
	bool done;
	Tensord__Reply *reply; /* owned once done; NULL if the connection died */
	int fd;                /* owned once done; -1 when none */
	struct td_pending *next;
};

struct tensord_client {
	atomic_uint refs;          /* the user's handle plus one per live lease */
	int fd;                    /* closed when the last reference goes */
	pthread_mutex_t send_lock; /* one frame at a time on the socket */
	pthread_mutex_t lock;      /* guards everything below */
	pthread_cond_t cond;
	bool reading;              /* some thread is receiving for everyone */
	bool closed;               /* tensord_close() ran, or the connection died */
	int err;                   /* why it died: -ECONNRESET, -EPROTO, ... */
	uint64_t next_id;
	struct td_pending *pending;
	struct td_mapping *maps;   /* every mapping some lease uses */
	uint8_t *rbuf;             /* received bytes not yet parsed */
	size_t rlen, rcap;
	uint64_t rpos;             /* stream offset of rbuf[0] */
	struct {
		uint64_t start, end;   /* stream bytes of the read that brought it */
		int fd;
	} fdq[TD_FDQ];             /* descriptors not yet matched to a frame */
	int n_fdq;
};

/* Round trip: sends req (its id is set here) and waits for its reply.
 * 0 with *ret_reply owned by the caller (free with tensord__reply__free_unpacked),
 * and *ret_fd (-1 when none), or -errno with the error message set. A reply
 * with a negative status is returned as that status, message set. */
int td_rpc(tensord_client *c, Tensord__Request *req, Tensord__Reply **ret_reply, int *ret_fd);

/* Sends a request that gets no reply (Release). */
int td_send_oneway(tensord_client *c, Tensord__Request *req);

void td_client_ref(tensord_client *c);
void td_client_unref(tensord_client *c);

/* The mapping behind a handle made by this library, or NULL. */
struct td_mapping *td_tensor_mapping(const DLManagedTensorVersioned *t);

/* Fills a tensord_info from the wire form. */
void td_info_from_wire(tensord_info *info, const Tensord__TensorInfo *w);

#endif
