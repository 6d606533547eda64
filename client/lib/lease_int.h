/*
 * libtensord: what lease.c and readopt.c share of a lease (lease.h has
 * the rest of the library's view of it).
 */
#ifndef TENSORD_CLIENT_LEASE_INT_H
#define TENSORD_CLIENT_LEASE_INT_H

#include "client.h"

#define LEASE_MAGIC 0x7e45d1ea

struct td_lease {
	uint32_t magic;
	atomic_uint refs;  /* handles alive */
	tensord_client *c; /* holds a client reference */
	uint64_t lease_id;
	struct td_mapping *map; /* holds a mapping reference; NULL for zero-size */
	void *view;             /* owned: this lease's own view of map (importer's view()),
				   NULL when it uses map itself */
	bool readonly;
	tensord_info info; /* shape and strides the handles point into */
	/*
	 * On memory the daemon exports itself (its mapping's importer says
	 * unmap_before_close): listed in c->ipc_leases until it ends, so that
	 * tensord_close() can release it once it unmapped the memory. Both
	 * guarded by c->lock.
	 */
	bool ipc_listed;
	bool released_by_close; /* tensord_close() released it: the deleter sends nothing */
	LIST_ENTRY(td_lease) ipc_link;
	/* A local lease (lease_id 0): served from this binding, one reference on it. */
	struct td_binding *binding;
	/*
	 * The connection the lease lives on now, in whose leases list it is
	 * (guarded by that client's lock): c, or after a restart a successor
	 * of c that re-adopted it (td_lease_readopt()), with lease_id the new
	 * daemon's and a reference of its own on that client.
	 */
	_Atomic(tensord_client *) at;
	LIST_ENTRY(td_lease) live_link;
	uint64_t serial; /* process-wide, never reused: who it is while unlocked */
};

/* The client l lives on now (td_lease.at), locked; stable while locked. */
tensord_client *td_lease_lock_at(struct td_lease *l);

#endif /* TENSORD_CLIENT_LEASE_INT_H */
