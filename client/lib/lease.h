/*
 * Leases in this process (lease.c): one struct td_lease per create or
 * attach, held by the DLPack handles made for it; the last deleter ends it.
 */
#ifndef TENSORD_CLIENT_LEASE_H
#define TENSORD_CLIENT_LEASE_H

#include <stdbool.h>

#include <tensord/tensord.h>

#include "import.h"
#include "proto/tensord.pb-c.h"

struct td_lease;

/*
 * Turns the Lease in a create or attach reply into a lease with no handle
 * yet; pass it to td_lease_handle() or td_lease_handle_legacy(). w is
 * borrowed for the call; created: this process created the tensor.
 * Takes ownership of fd (-1 when none): it is closed on every path.
 * Takes ownership of the reference on pinned (NULL when none), the cached
 * mapping the attach offered to reuse: kept by the lease or dropped.
 * On failure the lease the daemon granted is ended again.
 */
int td_lease_from_reply(tensord_client *c, const Tensord__Lease *w, int fd,
			struct td_mapping *pinned, bool created, struct td_lease **ret_lease);

/*
 * The same for the reply to a Create that named reserve rs and got it
 * (w->reserve): the lease maps the tensor where rs is mapped. Takes
 * ownership of rs's mapping and descriptor; on failure what is left in
 * rs (base not NULL) is the caller's to free (td_reserve_slot_free()).
 */
struct td_reserve_slot;

/*
 * The same for the reply to a create with TENSORD_RECYCLE that got a ring
 * buffer (w->ring), pinned by td_ring_lend(): the lease's view is that
 * buffer's mapping (len bytes at base), lent; its end unpins it.
 */
int td_lease_from_ring(tensord_client *c, const Tensord__Lease *w, uint8_t *base, uint64_t len,
		       struct td_lease **ret_lease);
int td_lease_from_reserve(tensord_client *c, const Tensord__Lease *w, struct td_reserve_slot *rs,
			  struct td_lease **ret_lease);

/*
 * A local lease (bindings.c): one served from binding b without asking the
 * daemon, on mapping m (NULL for zero-size), through a private view of its
 * own when need_view. Takes ownership of one reference on b and one on m:
 * kept by the lease, or dropped on failure.
 */
struct td_binding;
int td_lease_local(tensord_client *c, struct td_binding *b, const tensord_info *info,
		   struct td_mapping *m, bool readonly, bool need_view,
		   struct td_lease **ret_lease);

/*
 * l, just made from a bound attach, becomes b's first local lease (b then
 * holds one reference from l). Returns the daemon's lease, which is b's
 * from now on; *ret_info and *ret_writable are l's. l->c's lock held.
 */
uint64_t td_lease_bind(struct td_lease *l, struct td_binding *b, tensord_info *ret_info,
		       bool *ret_writable);

/* The mapping l uses (NULL for zero-size tensors). Borrowed: valid while l lives. */
struct td_mapping *td_lease_mapping(const struct td_lease *l);

/*
 * Takes ownership of l. On success *ret_tensor holds it, and its deleter
 * ends it; on failure l is ended here.
 */
int td_lease_handle(struct td_lease *l, DLManagedTensorVersioned **ret_tensor);

/* The same, as a pre-1.0 DLManagedTensor. Takes ownership of l likewise. */
int td_lease_handle_legacy(struct td_lease *l, DLManagedTensor **ret_tensor);

/*
 * The mapping behind a handle made by this library, or NULL.
 * Borrowed: valid until t's deleter runs.
 */
struct td_mapping *td_tensor_mapping(const DLManagedTensorVersioned *t);

/* Ends a lease that no td_lease holds (one-way Release; no reply). */
void td_lease_end(tensord_client *c, uint64_t lease_id);

/*
 * For tensord_close(), after td_mapcache_revoke() closed every IPC handle:
 * releases every live lease on memory the daemon exports itself (legacy
 * CUDA IPC, HIP IPC), so that the daemon frees that memory at once. A
 * legacy IPC lease still held when a connection ends is one whose handle
 * may still be open, which the daemon keeps until this process exits
 * (docs/gpu.md). Their deleters later send nothing. Queues the Releases
 * (td_release()); the caller flushes them before the socket shuts.
 */
void td_lease_release_ipc(tensord_client *c);

/*
 * After a restart (docs/restart.md, section 5): succ, the successor of
 * old, a lost connection, reaches a daemon of old's lineage that is
 * another instance. Offers it every lease living on old; those it takes
 * move to succ with their new ids. Returns how many moved. Keeps the
 * calling thread's error message.
 */
unsigned td_lease_readopt(tensord_client *old, tensord_client *succ);

/* Fills a tensord_info from the wire form. w is borrowed for the call. */
void td_info_from_wire(tensord_info *info, const Tensord__TensorInfo *w);

#endif /* TENSORD_CLIENT_LEASE_H */
