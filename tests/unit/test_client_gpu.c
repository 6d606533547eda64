/*
 * Unit tests for libtensord's GPU logic against fake driver tables
 * (fake_gpu.h): device numbering through UUIDs (this process's cuda:0 is
 * the daemon's cuda:1 and the other way round), the order of driver calls
 * in tensord_close() with live legacy-IPC and HIP imports, read-only
 * protection of VMM mappings (readers, and the creator after publish), the
 * same access for this process's other devices that can reach the memory, the
 * stream put() copies on, HIP sync and copy_in, zero-size GPU leases, and
 * the UUID a create sends, and a forked child that makes no driver call.
 * No driver and no daemon: a socketpair stands in for the connection, and
 * a thread answers as the daemon where one must.
 */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "client/lib/client.h"
#include "gpu/gpu_util.h"
#include "fake_gpu.h"
#include "proto/frame.h"

#define MiB (1ull << 20)

/*
 * Two GPUs. This process sees them swapped (CUDA_VISIBLE_DEVICES=1,0):
 * our ordinal 0 has the UUID of the daemon's ordinal 1, and ours 1 that of
 * the daemon's 0. fake_uuid[] is our view.
 */
static const uint8_t *daemon_uuid(int daemon_ordinal)
{
	return fake_uuid[1 - daemon_ordinal];
}

static int setup(void **state)
{
	fake_gpu_install(2);
	td_clear_error();
	return 0;
}

static int teardown(void **state)
{
	fake_gpu_remove();
	return 0;
}

/* A Lease reply as the daemon sends it, in storage the test owns. */
struct wire {
	Tensord__Lease l;
	Tensord__TensorInfo info;
	Tensord__DType dt;
	Tensord__Device dev;
	int64_t shape[1];
	uint8_t handle[64];
};

static void wire_fill(struct wire *w, Tensord__HandleKind kind, DLDeviceType type,
		      int daemon_ordinal, int64_t n, bool writable)
{
	tensord__lease__init(&w->l);
	tensord__tensor_info__init(&w->info);
	tensord__dtype__init(&w->dt);
	tensord__device__init(&w->dev);
	w->dt.code = kDLFloat;
	w->dt.bits = 32;
	w->dt.lanes = 1;
	w->shape[0] = n;
	w->dev.type = type;
	w->dev.id = daemon_ordinal;
	if (type != kDLCPU) {
		w->dev.uuid.data = (uint8_t *)daemon_uuid(daemon_ordinal);
		w->dev.uuid.len = 16;
	}
	w->info.name = "t";
	w->info.dtype = &w->dt;
	w->info.n_shape = 1;
	w->info.shape = w->shape;
	w->info.device = &w->dev;
	w->info.nbytes = (uint64_t)n * 4;
	w->info.id = 42;
	memset(w->handle, 0x5a, sizeof(w->handle));
	w->l.lease = 7;
	w->l.info = &w->info;
	w->l.handle = kind;
	w->l.map_size = n ? 2 * MiB : 0;
	w->l.writable = writable;
	if (kind == TENSORD__HANDLE_KIND__HANDLE_CUDA_IPC ||
	    kind == TENSORD__HANDLE_KIND__HANDLE_HIP_IPC) {
		w->l.ipc_handle.data = w->handle;
		w->l.ipc_handle.len = sizeof(w->handle);
	}
}

/* A handle for w on c, through the library's own lease path. */
static DLManagedTensorVersioned *lease(tensord_client *c, struct wire *w, int fd)
{
	DLManagedTensorVersioned *t = NULL;
	struct td_lease *l;

	assert_int_equal(td_lease_from_reply(c, &w->l, fd, NULL, false, &l), 0);
	assert_int_equal(td_lease_handle(l, &t), 0);
	return t;
}

/* --- device numbering ------------------------------------------------------ */

static void test_uuid_translation(void **state)
{
	DLDevice local;
	uint8_t u[16];

	/* The daemon's cuda:0 is our cuda:1, its cuda:1 our cuda:0. */
	assert_int_equal(td_gpu_local_device((DLDevice){ kDLCUDA, 0 }, daemon_uuid(0), 16, &local),
			 0);
	assert_int_equal(local.device_type, kDLCUDA);
	assert_int_equal(local.device_id, 1);
	assert_int_equal(td_gpu_local_device((DLDevice){ kDLCUDA, 1 }, daemon_uuid(1), 16, &local),
			 0);
	assert_int_equal(local.device_id, 0);
	/* And back: our cuda:0 travels as the UUID the daemon knows as its 1. */
	assert_int_equal(td_gpu_device_uuid((DLDevice){ kDLCUDA, 0 }, u), 0);
	assert_memory_equal(u, daemon_uuid(1), 16);
	assert_int_equal(td_gpu_device_uuid((DLDevice){ kDLCUDA, 2 }, u), -ENODEV);
	assert_non_null(strstr(tensord_last_error(), "cuda:2"));
	/* HIP the same way. */
	assert_int_equal(td_gpu_local_device((DLDevice){ kDLROCM, 0 }, daemon_uuid(0), 16, &local),
			 0);
	assert_int_equal(local.device_type, kDLROCM);
	assert_int_equal(local.device_id, 1);
	assert_int_equal(td_gpu_device_uuid((DLDevice){ kDLROCM, 1 }, u), 0);
	assert_memory_equal(u, daemon_uuid(0), 16);
}

static void test_uuid_not_visible(void **state)
{
	uint8_t other[16];
	DLDevice local;

	memset(other, 0xEE, sizeof(other));
	assert_int_equal(td_gpu_local_device((DLDevice){ kDLCUDA, 3 }, other, 16, &local), -ENODEV);
	assert_non_null(strstr(tensord_last_error(), "cuda:3"));
	assert_non_null(strstr(tensord_last_error(), "GPU-eeeeeeee-"));
	assert_non_null(strstr(tensord_last_error(), "CUDA_VISIBLE_DEVICES"));
	assert_int_equal(td_gpu_local_device((DLDevice){ kDLROCM, 0 }, other, 16, &local), -ENODEV);
	assert_non_null(strstr(tensord_last_error(), "HIP_VISIBLE_DEVICES"));
}

/* A HIP runtime without hipDeviceGetUuid: ordinals are all there is. */
static void test_hip_without_uuids(void **state)
{
	DLDevice local;
	uint8_t u[16];

	fake_hip.DeviceGetUuid = NULL;
	assert_int_equal(td_gpu_device_uuid((DLDevice){ kDLROCM, 1 }, u), -ENOENT);
	assert_int_equal(td_gpu_local_device((DLDevice){ kDLROCM, 1 }, daemon_uuid(1), 16, &local),
			 0);
	assert_int_equal(local.device_id, 1);
	assert_int_equal(td_gpu_local_device((DLDevice){ kDLROCM, 5 }, NULL, 0, &local), -ENODEV);
}

/* A lease's handle, info and mapping carry this process's ordinal. */
static void test_lease_device_is_local(void **state)
{
	tensord_client *c = td_client_new(-1);
	DLManagedTensorVersioned *t;
	tensord_info info;
	struct wire w;
	int i;

	wire_fill(&w, TENSORD__HANDLE_KIND__HANDLE_CUDA_IPC, kDLCUDA, 0, 16, false);
	t = lease(c, &w, -1);
	assert_int_equal(t->dl_tensor.device.device_type, kDLCUDA);
	assert_int_equal(t->dl_tensor.device.device_id, 1);
	assert_int_equal(tensord_tensor_info(t, &info), 0);
	assert_int_equal(info.device.device_id, 1);
	assert_int_equal((uintptr_t)t->dl_tensor.data, 0x20000000);
	assert_true(t->flags & DLPACK_FLAG_BITMASK_READ_ONLY);
	/* Legacy IPC cannot map read-only: the flag is all there is. */
	assert_int_equal(tensord_tensor_read_only_enforced(t), 0);
	assert_int_equal(tensord_tensor_read_only_enforced(NULL), -EINVAL);
	/* The handle was opened with our device's primary context pushed. */
	i = fake_find("cuDevicePrimaryCtxRetain", 0);
	assert_true(i >= 0);
	assert_int_equal(fake_log[i].a[0], FAKE_DEV0 + 1);
	assert_true(fake_find("cuIpcOpenMemHandle", i) > i);
	t->deleter(t);
	assert_int_equal(fake_count("cuIpcCloseMemHandle"), 1);
	td_client_unref(c);
}

/* Zero-size GPU tensors: no host address, and our ordinal found by UUID. */
static void test_zero_size_gpu_lease(void **state)
{
	tensord_client *c = td_client_new(-1);
	DLManagedTensorVersioned *t;
	struct wire w;

	wire_fill(&w, TENSORD__HANDLE_KIND__HANDLE_NONE, kDLCUDA, 1, 0, false);
	t = lease(c, &w, -1);
	assert_null(t->dl_tensor.data);
	assert_int_equal(t->dl_tensor.device.device_type, kDLCUDA);
	assert_int_equal(t->dl_tensor.device.device_id, 0);
	t->deleter(t);
	/* A host one keeps a valid, aligned address. */
	wire_fill(&w, TENSORD__HANDLE_KIND__HANDLE_NONE, kDLCPU, 0, 0, false);
	t = lease(c, &w, -1);
	assert_non_null(t->dl_tensor.data);
	assert_int_equal((uintptr_t)t->dl_tensor.data % 256, 0);
	assert_int_equal(t->dl_tensor.device.device_type, kDLCPU);
	t->deleter(t);
	td_client_unref(c);
}

/* --- tensord_close() with live imports ------------------------------------- */

static int peer_fd = -1;
static int closes_before_eof;

/*
 * Reads what the client sent on fd until its end: every frame must be a
 * Release, whose leases go to ids[] (at most max). Their number.
 */
static int read_releases(int fd, uint64_t *ids, int max)
{
	uint8_t buf[4096];
	size_t len = 0, off = 0;
	ssize_t n;
	int k = 0;

	while ((n = recv(fd, buf + len, sizeof(buf) - len, 0)) > 0)
		len += (size_t)n;
	assert_int_equal(n, 0);
	while (off < len) {
		uint32_t plen;
		Tensord__Request *req;

		assert_true(len - off >= TD_FRAME_HEADER);
		memcpy(&plen, buf + off, sizeof(plen));
		assert_true(len - off - TD_FRAME_HEADER >= plen);
		req = tensord__request__unpack(NULL, plen, buf + off + TD_FRAME_HEADER);
		assert_non_null(req);
		assert_int_equal(req->body_case, TENSORD__REQUEST__BODY_RELEASE);
		assert_true(k < max);
		ids[k++] = req->release->lease;
		tensord__request__free_unpacked(req, NULL);
		off += TD_FRAME_HEADER + plen;
	}
	return k;
}

static int cmp_u64(const void *a, const void *b)
{
	uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;

	return x < y ? -1 : x > y;
}

/* Called by the fake cuIpcCloseMemHandle / hipIpcCloseMemHandle. */
static void check_daemon_still_connected(uint64_t ptr)
{
	char b;
	ssize_t n = recv(peer_fd, &b, 1, MSG_DONTWAIT);

	/* Nothing to read and no EOF: the daemon cannot have freed anything. */
	if (n < 0 && errno == EAGAIN)
		closes_before_eof++;
}

static void test_close_unmaps_ipc_first(void **state)
{
	DLManagedTensorVersioned *ipc, *ipc2, *hip, *vmm;
	struct wire w1, w2, w3;
	tensord_client *c;
	int sp[2], pfd[2];
	uint64_t ids[8];

	assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sp), 0);
	peer_fd = sp[1];
	c = td_client_new(sp[0]);
	wire_fill(&w1, TENSORD__HANDLE_KIND__HANDLE_CUDA_IPC, kDLCUDA, 0, 16, false);
	ipc = lease(c, &w1, -1);
	/* A second tensor: a handle of its own to close (another allocation's bytes). */
	w1.l.lease = 8;
	w1.info.id = 43;
	w1.handle[0] ^= 1;
	ipc2 = lease(c, &w1, -1);
	wire_fill(&w2, TENSORD__HANDLE_KIND__HANDLE_HIP_IPC, kDLROCM, 1, 16, false);
	w2.l.lease = 9;
	hip = lease(c, &w2, -1);
	wire_fill(&w3, TENSORD__HANDLE_KIND__HANDLE_CUDA_VMM_FD, kDLCUDA, 1, 16, false);
	w3.l.lease = 10;
	assert_int_equal(pipe(pfd), 0);
	close(pfd[1]);
	vmm = lease(c, &w3, pfd[0]);
	fake_on_close = check_daemon_still_connected;
	fake_n = 0;

	tensord_close(c);
	/* Every legacy handle was closed while the socket was still open... */
	assert_int_equal(fake_count("cuIpcCloseMemHandle"), 2);
	assert_int_equal(fake_count("hipIpcCloseMemHandle"), 1);
	/* ...each after the device's queued work was waited for. */
	assert_in_range(fake_find("cuCtxSynchronize", 0), 0, fake_find("cuIpcCloseMemHandle", 0));
	assert_in_range(fake_find("hipDeviceSynchronize", 0), 0,
			fake_find("hipIpcCloseMemHandle", 0));
	assert_int_equal(closes_before_eof, 3);
	/*
	 * ...then those leases were released, and the daemon saw the end of the
	 * connection afterwards: a legacy IPC lease still held at the end would
	 * be kept until this process exits. The VMM lease ends with the
	 * connection, as before.
	 */
	assert_int_equal(read_releases(peer_fd, ids, 8), 3);
	qsort(ids, 3, sizeof(ids[0]), cmp_u64);
	assert_int_equal(ids[0], 7);
	assert_int_equal(ids[1], 8);
	assert_int_equal(ids[2], 9);
	/* VMM mappings are the driver's to refcount: left alone. */
	assert_int_equal(fake_count("cuMemUnmap"), 0);

	/* The deleters afterwards do not touch the closed GPU handles again. */
	fake_n = 0;
	ipc->deleter(ipc);
	ipc2->deleter(ipc2);
	hip->deleter(hip);
	assert_int_equal(fake_count("cuIpcCloseMemHandle"), 0);
	assert_int_equal(fake_count("hipIpcCloseMemHandle"), 0);
	fake_n = 0;
	vmm->deleter(vmm);
	assert_int_equal(fake_count("cuMemUnmap"), 1);
	assert_int_equal(fake_count("cuMemAddressFree"), 1);
	/* Kernels a consumer queued on it finish before the unmap. */
	assert_in_range(fake_find("cuCtxSynchronize", 0), 0, fake_find("cuMemUnmap", 0));
	close(peer_fd);
	fake_on_close = NULL;
}

/* Releases deleters queued just before the close reach the daemon before its end. */
static void test_close_sends_queued_releases(void **state)
{
	DLManagedTensorVersioned *vmm;
	tensord_client *c;
	struct wire w;
	int sp[2], pfd[2];
	uint64_t ids[4];

	assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sp), 0);
	c = td_client_new(sp[0]);
	td_relq_start(&c->conn, &c->maps);
	wire_fill(&w, TENSORD__HANDLE_KIND__HANDLE_CUDA_VMM_FD, kDLCUDA, 1, 16, false);
	w.l.lease = 11;
	assert_int_equal(pipe(pfd), 0);
	close(pfd[1]);
	vmm = lease(c, &w, pfd[0]);
	/* Queued for the flusher (up to 1 ms), then the close at once. */
	vmm->deleter(vmm);
	tensord_close(c);
	assert_int_equal(read_releases(sp[1], ids, 4), 1);
	assert_int_equal(ids[0], 11);
	close(sp[1]);
}

/* The daemon's rule (td_gpu_handle_ipc()) and the client's importers agree on legacy IPC. */
static void test_ipc_kinds_agree(void **state)
{
	for (const struct td_gpu_handle *h = td_gpu_handles; h->vendor; h++) {
		const struct td_importer *imp = td_importer_for(h->kind);

		assert_non_null(imp);
		assert_int_equal(imp->unmap_before_close, td_gpu_handle_ipc(h->kind));
	}
}

/* --- read-only VMM mappings ------------------------------------------------ */

/* Index of the last cuMemSetAccess call the fake driver accepted. */
static int last_granted(void)
{
	for (int k = fake_n - 1; k >= 0; k--)
		if (strcmp(fake_log[k].fn, "cuMemSetAccess") == 0 &&
		    fake_log[k].a[3] == CUDA_SUCCESS)
			return k;
	fail_msg("no cuMemSetAccess was accepted");
	return -1;
}

/*
 * The cuMemSetAccess call at log index k: the mapping's range, the owner's
 * descriptor first (this process's ordinal owner), then each other device
 * once, all with the same flags. Returns those flags; *ret_devs gets the
 * ordinals it covered (bit i: ordinal i).
 */
static uint64_t access_at(int k, int owner, uint64_t *ret_devs)
{
	uint64_t flags, devs = 0;
	int n;

	assert_true(k >= 0);
	assert_string_equal(fake_log[k].fn, "cuMemSetAccess");
	assert_int_equal(fake_log[k].a[0], 0x30000000);
	assert_int_equal(fake_log[k].a[1], 2 * MiB);
	n = (int)fake_log[k].a[2];
	assert_true(n >= 1 && k + n < fake_n);
	assert_int_equal(fake_log[k + 1].a[1], (uint64_t)owner);
	flags = fake_log[k + 1].a[2];
	for (int i = 0; i < n; i++) {
		const struct fake_call *d = &fake_log[k + 1 + i];

		assert_string_equal(d->fn, "cuMemSetAccess.desc");
		assert_int_equal(d->a[0], CU_MEM_LOCATION_TYPE_DEVICE);
		assert_int_equal(d->a[2], flags);
		assert_int_equal(d->a[3], (uint64_t)i);
		assert_true(d->a[1] < 4);
		assert_false(devs & (1ull << d->a[1]));
		devs |= 1ull << d->a[1];
	}
	*ret_devs = devs;
	return flags;
}

/*
 * The flags of the last access granted, checking its range and that it
 * covered the owner (this process's ordinal owner) and its peer: the fake's
 * two devices reach each other unless a test says otherwise.
 */
static uint64_t last_access(int owner)
{
	uint64_t devs, flags = access_at(last_granted(), owner, &devs);

	assert_int_equal(devs, 3);
	return flags;
}

static void map_vmm(struct td_mapping *m, int daemon_ordinal, bool writable)
{
	struct td_import_desc d = {
		.handle_kind = TENSORD__HANDLE_KIND__HANDLE_CUDA_VMM_FD,
		.map_size = 2 * MiB,
		.writable = writable,
		.device = { kDLCUDA, daemon_ordinal },
		.uuid = daemon_uuid(daemon_ordinal),
		.uuid_len = 16,
	};
	int p[2];

	assert_int_equal(pipe(p), 0);
	close(p[1]);
	memset(m, 0, sizeof(*m));
	snprintf(m->name, sizeof(m->name), "t");
	assert_int_equal(td_importer_cuda.map(m, p[0], &d), 0);
	/* The descriptor is closed once imported. */
	assert_int_equal(fcntl(p[0], F_GETFD), -1);
}

/*
 * Issue 30: mappings of one allocation in one process (the creator's and
 * its own attach; leases over two connections) share one import: a VMM
 * handle is imported once (the driver need not hand out a second one,
 * and a release of the one it gave ended both), each mapping keeps a
 * range and access of its own, and the handle goes with the last; a
 * legacy IPC handle is opened once and closed with the last.
 */
static void map_vmm_of(struct td_mapping *m, uint64_t instance, uint64_t id, bool writable)
{
	struct td_import_desc d = {
		.handle_kind = TENSORD__HANDLE_KIND__HANDLE_CUDA_VMM_FD,
		.map_size = 2 * MiB,
		.writable = writable,
		.device = { kDLCUDA, 0 },
		.uuid = daemon_uuid(0),
		.uuid_len = 16,
		.daemon_instance = instance,
		.tensor_id = id,
	};
	int p[2];

	assert_int_equal(pipe(p), 0);
	close(p[1]);
	memset(m, 0, sizeof(*m));
	assert_int_equal(td_importer_cuda.map(m, p[0], &d), 0);
	assert_int_equal(fcntl(p[0], F_GETFD), -1);
}

static void test_vmm_one_import_per_process(void **state)
{
	struct td_mapping w, r, other, old;

	map_vmm_of(&w, 77, 5, true);
	map_vmm_of(&r, 77, 5, false);
	assert_int_equal(fake_count("cuMemImportFromShareableHandle"), 1);
	/* Two ranges, two accesses. */
	assert_int_equal(fake_count("cuMemMap"), 2);
	assert_int_equal(fake_count("cuMemAddressReserve"), 2);
	assert_false(w.ro_enforced);
	assert_true(r.ro_enforced);
	/* Another tensor, or the same id of another daemon, or a daemon that names none: imported. */
	map_vmm_of(&other, 77, 6, false);
	map_vmm_of(&old, 78, 5, false);
	assert_int_equal(fake_count("cuMemImportFromShareableHandle"), 3);
	td_importer_cuda.unmap(&other);
	td_importer_cuda.unmap(&old);
	map_vmm_of(&other, 0, 5, false);
	map_vmm_of(&old, 0, 5, false);
	assert_int_equal(fake_count("cuMemImportFromShareableHandle"), 5);
	td_importer_cuda.unmap(&other);
	td_importer_cuda.unmap(&old);
	fake_n = 0;
	/* The creator's mapping goes first: the reader's handle stays. */
	td_importer_cuda.unmap(&w);
	assert_int_equal(fake_count("cuMemUnmap"), 1);
	assert_int_equal(fake_count("cuMemRelease"), 0);
	td_importer_cuda.unmap(&r);
	assert_int_equal(fake_count("cuMemUnmap"), 2);
	assert_int_equal(fake_count("cuMemRelease"), 1);
	/* After the last, a new mapping imports again. */
	fake_n = 0;
	map_vmm_of(&r, 77, 5, false);
	assert_int_equal(fake_count("cuMemImportFromShareableHandle"), 1);
	td_importer_cuda.unmap(&r);
	assert_int_equal(fake_count("cuMemRelease"), 1);
}

static void test_ipc_one_open_per_process(void **state)
{
	DLManagedTensorVersioned *a, *b;
	struct wire w1, w2;
	tensord_client *c1, *c2;
	int sp1[2], sp2[2];

	/* Two connections of this process lease the same allocation. */
	assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sp1), 0);
	assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sp2), 0);
	c1 = td_client_new(sp1[0]);
	c2 = td_client_new(sp2[0]);
	wire_fill(&w1, TENSORD__HANDLE_KIND__HANDLE_CUDA_IPC, kDLCUDA, 0, 16, false);
	wire_fill(&w2, TENSORD__HANDLE_KIND__HANDLE_CUDA_IPC, kDLCUDA, 0, 16, false);
	a = lease(c1, &w1, -1);
	b = lease(c2, &w2, -1);
	assert_int_equal(fake_count("cuIpcOpenMemHandle"), 1);
	assert_ptr_equal(a->dl_tensor.data, b->dl_tensor.data);
	fake_n = 0;
	a->deleter(a);
	assert_int_equal(fake_count("cuIpcCloseMemHandle"), 0);
	b->deleter(b);
	assert_int_equal(fake_count("cuIpcCloseMemHandle"), 1);
	tensord_close(c1);
	tensord_close(c2);
	close(sp1[1]);
	close(sp2[1]);
}

static void test_vmm_reader_read_only(void **state)
{
	struct td_mapping m;

	map_vmm(&m, 0, false);
	assert_int_equal(last_access(1), CU_MEM_ACCESS_FLAGS_PROT_READ);
	assert_int_equal(m.device.device_id, 1);
	assert_true(m.ro_enforced);
	td_importer_cuda.unmap(&m);
	/* A driver that cannot map read-only: read-write, and it says so. */
	fake_n = 0;
	fake_set_access_ro_rc = CUDA_ERROR_NOT_SUPPORTED;
	map_vmm(&m, 1, false);
	/* Read-only for both devices, then for the owner alone, then read-write for both. */
	assert_int_equal(fake_count("cuMemSetAccess"), 3);
	assert_int_equal(last_access(0), CU_MEM_ACCESS_FLAGS_PROT_READWRITE);
	assert_false(m.ro_enforced);
	td_importer_cuda.unmap(&m);
}

static void test_vmm_creator_protected_at_publish(void **state)
{
	struct td_mapping m;
	int push;

	map_vmm(&m, 0, true);
	assert_int_equal(last_access(1), CU_MEM_ACCESS_FLAGS_PROT_READWRITE);
	assert_false(m.ro_enforced);
	fake_n = 0;
	/* Read-only for the peer too (last_access() checks both devices). */
	assert_int_equal(td_importer_cuda.make_private(&m), 0);
	assert_int_equal(fake_count("cuMemSetAccess"), 1);
	assert_int_equal(last_access(1), CU_MEM_ACCESS_FLAGS_PROT_READ);
	assert_true(m.ro_enforced);
	/* With our device's context pushed, and popped again. */
	push = fake_find("cuCtxPushCurrent", 0);
	assert_true(push >= 0 && push < fake_find("cuMemSetAccess", 0));
	assert_true(fake_find("cuCtxPopCurrent", push) > fake_find("cuMemSetAccess", 0));
	/* A failed publish makes it writable again. */
	assert_int_equal(td_importer_cuda.make_shared(&m), 0);
	assert_int_equal(last_access(1), CU_MEM_ACCESS_FLAGS_PROT_READWRITE);
	assert_false(m.ro_enforced);
	td_importer_cuda.unmap(&m);
	/* A driver refusing PROT_READ at publish: read-write, and it says so. */
	map_vmm(&m, 0, true);
	fake_set_access_ro_rc = CUDA_ERROR_NOT_SUPPORTED;
	assert_int_equal(td_importer_cuda.make_private(&m), 0);
	assert_int_equal(last_access(1), CU_MEM_ACCESS_FLAGS_PROT_READWRITE);
	assert_false(m.ro_enforced);
	td_importer_cuda.unmap(&m);
	/* Legacy IPC has nothing to re-protect. */
	assert_null(td_importer_cuda_ipc.make_private);
}

/*
 * A peer copy (torch's .to("cuda:1")) reads the memory from another device
 * of this process: every device that can reach the owner gets the owner's
 * access, in the same cuMemSetAccess call.
 */
static void test_vmm_access_for_peers(void **state)
{
	struct td_mapping m;
	uint64_t devs;
	int k;

	/* Our two devices reach each other: one call, both devices, read-only. */
	map_vmm(&m, 0, false);
	assert_int_equal(fake_count("cuMemSetAccess"), 1);
	k = fake_find("cuMemSetAccess", 0);
	assert_int_equal(fake_log[k].a[2], 2);
	assert_int_equal(access_at(k, 1, &devs), CU_MEM_ACCESS_FLAGS_PROT_READ);
	assert_int_equal(devs, 3);
	assert_true(m.ro_enforced);
	assert_int_equal(m.peers, 1);
	assert_false(m.peers_refused);
	/* Asked whether our device 0 reaches the owner, our 1, as CUdevices. */
	k = fake_find("cuDeviceCanAccessPeer", 0);
	assert_true(k >= 0);
	assert_int_equal(fake_log[k].a[0], FAKE_DEV0 + 0);
	assert_int_equal(fake_log[k].a[1], FAKE_DEV0 + 1);
	assert_int_equal(fake_count("cuDeviceCanAccessPeer"), 1);
	td_importer_cuda.unmap(&m);

	/* Writable: read-write for both. */
	fake_n = 0;
	map_vmm(&m, 1, true);
	assert_int_equal(fake_count("cuMemSetAccess"), 1);
	assert_int_equal(access_at(fake_find("cuMemSetAccess", 0), 0, &devs),
			 CU_MEM_ACCESS_FLAGS_PROT_READWRITE);
	assert_int_equal(devs, 3);
	assert_int_equal(m.peers, 1);
	td_importer_cuda.unmap(&m);

	/* No peer can reach the owner: the owner alone, and nothing was refused. */
	fake_n = 0;
	fake_peer_ok = 0;
	map_vmm(&m, 0, false);
	assert_int_equal(fake_count("cuMemSetAccess"), 1);
	k = fake_find("cuMemSetAccess", 0);
	assert_int_equal(fake_log[k].a[2], 1);
	assert_int_equal(access_at(k, 1, &devs), CU_MEM_ACCESS_FLAGS_PROT_READ);
	assert_int_equal(devs, 2);
	assert_true(m.ro_enforced);
	assert_int_equal(m.peers, 0);
	assert_false(m.peers_refused);
	td_importer_cuda.unmap(&m);

	/* Three devices, ordinal 2 unable to reach the owner (our 1): 1 and 0 only. */
	fake_n = 0;
	fake_ndev = 3;
	fake_peer_ok = ~(1u << 2);
	map_vmm(&m, 0, true);
	assert_int_equal(fake_count("cuMemSetAccess"), 1);
	assert_int_equal(access_at(fake_find("cuMemSetAccess", 0), 1, &devs),
			 CU_MEM_ACCESS_FLAGS_PROT_READWRITE);
	assert_int_equal(devs, 3);
	assert_int_equal(m.peers, 1);
	td_importer_cuda.unmap(&m);
}

/*
 * The driver refuses access for several devices: the mapping falls back to
 * the owner alone and says so. Publish re-protects exactly the devices the
 * map gave access, never fewer: a peer left out would keep writing.
 */
static void test_vmm_peers_refused(void **state)
{
	struct td_mapping m;
	uint64_t devs;

	fake_set_access_peers_rc = CUDA_ERROR_INVALID_DEVICE;
	map_vmm(&m, 0, false);
	assert_int_equal(fake_count("cuMemSetAccess"), 2);
	assert_int_equal(access_at(last_granted(), 1, &devs), CU_MEM_ACCESS_FLAGS_PROT_READ);
	assert_int_equal(devs, 2);
	assert_true(m.ro_enforced);
	assert_int_equal(m.peers, 0);
	assert_true(m.peers_refused);
	td_importer_cuda.unmap(&m);

	/* A creator whose peers were refused: publish protects the owner alone. */
	map_vmm(&m, 0, true);
	assert_true(m.peers_refused);
	fake_n = 0;
	assert_int_equal(td_importer_cuda.make_private(&m), 0);
	assert_int_equal(fake_count("cuMemSetAccess"), 1);
	assert_int_equal(access_at(last_granted(), 1, &devs), CU_MEM_ACCESS_FLAGS_PROT_READ);
	assert_int_equal(devs, 2);
	assert_true(m.ro_enforced);
	assert_int_equal(td_importer_cuda.make_shared(&m), 0);
	assert_int_equal(access_at(last_granted(), 1, &devs), CU_MEM_ACCESS_FLAGS_PROT_READWRITE);
	assert_int_equal(devs, 2);
	td_importer_cuda.unmap(&m);

	/* Granted at the map, refused at publish: the publish fails, nothing narrowed. */
	fake_set_access_peers_rc = CUDA_SUCCESS;
	map_vmm(&m, 0, true);
	assert_int_equal(m.peers, 1);
	fake_set_access_peers_rc = CUDA_ERROR_INVALID_DEVICE;
	fake_n = 0;
	assert_true(td_importer_cuda.make_private(&m) < 0);
	assert_non_null(strstr(tensord_last_error(), "read-only at publish"));
	assert_int_equal(fake_count("cuMemSetAccess"), 1);
	assert_int_equal(fake_log[fake_find("cuMemSetAccess", 0)].a[2], 2);
	assert_false(m.ro_enforced);
	td_importer_cuda.unmap(&m);
}

/* A driver that refuses PROT_READ: read-write for the owner and its peer alike. */
static void test_vmm_read_only_fallback_with_peers(void **state)
{
	struct td_mapping m;
	uint64_t devs;

	fake_set_access_ro_rc = CUDA_ERROR_NOT_SUPPORTED;
	map_vmm(&m, 0, false);
	assert_int_equal(access_at(last_granted(), 1, &devs), CU_MEM_ACCESS_FLAGS_PROT_READWRITE);
	assert_int_equal(devs, 3);
	assert_false(m.ro_enforced);
	assert_int_equal(m.peers, 1);
	assert_false(m.peers_refused);
	td_importer_cuda.unmap(&m);

	/* The creator at publish: read-only refused for both, read-write for both. */
	map_vmm(&m, 0, true);
	fake_n = 0;
	assert_int_equal(td_importer_cuda.make_private(&m), 0);
	assert_int_equal(fake_count("cuMemSetAccess"), 2);
	assert_int_equal(access_at(fake_find("cuMemSetAccess", 0), 1, &devs),
			 CU_MEM_ACCESS_FLAGS_PROT_READ);
	assert_int_equal(devs, 3);
	assert_int_equal(last_access(1), CU_MEM_ACCESS_FLAGS_PROT_READWRITE);
	assert_false(m.ro_enforced);
	assert_int_equal(m.peers, 1);
	td_importer_cuda.unmap(&m);
}

/* --- streams: sync at publish, copy_in for put() ---------------------------- */

static void test_cuda_copy_in_on_put_stream(void **state)
{
	static const uint8_t src[4];
	struct td_mapping m;
	int cp, sy;

	map_vmm(&m, 0, true);
	fake_n = 0;
	assert_int_equal(td_importer_cuda.copy_in(&m, src, 1000), 0);
	cp = fake_find("cuMemcpyAsync", 0);
	assert_true(cp > fake_find("cuCtxPushCurrent", 0));
	assert_int_equal(fake_log[cp].a[0], (uintptr_t)m.data);
	assert_int_equal(fake_log[cp].a[1], (uintptr_t)src);
	assert_int_equal(fake_log[cp].a[2], 1000);
	/* The stream the producer was told about (DLPack stream 1: legacy default). */
	assert_int_equal(fake_log[cp].a[3], (uint64_t)td_gpu_put_stream(TD_GPU_DL_CUDA));
	sy = fake_find("cuStreamSynchronize", cp);
	assert_true(sy > cp);
	assert_int_equal(fake_log[sy].a[0], 1);
	assert_true(fake_find("cuCtxPopCurrent", sy) > sy);
	/* publish waits for the whole context. */
	fake_n = 0;
	assert_int_equal(td_importer_cuda.sync(&m), 0);
	assert_int_equal(fake_count("cuCtxSynchronize"), 1);
	td_importer_cuda.unmap(&m);
}

static void map_hip(struct td_mapping *m, int daemon_ordinal)
{
	uint8_t h[64] = { 0 };
	struct td_import_desc d = {
		.handle_kind = TENSORD__HANDLE_KIND__HANDLE_HIP_IPC,
		.map_size = 2 * MiB,
		.device = { kDLROCM, daemon_ordinal },
		.uuid = daemon_uuid(daemon_ordinal),
		.uuid_len = 16,
		.ipc_handle = h,
		.ipc_handle_len = sizeof(h),
	};

	memset(m, 0, sizeof(*m));
	snprintf(m->name, sizeof(m->name), "t");
	assert_int_equal(td_importer_hip.map(m, -1, &d), 0);
}

static void test_hip_sync_and_copy_in(void **state)
{
	static const uint8_t src[4];
	struct td_mapping m;
	int i;

	fake_hip_cur = 0; /* the application's device */
	map_hip(&m, 0);   /* the daemon's rocm:0 is our rocm:1 */
	assert_int_equal(m.device.device_id, 1);
	i = fake_find("hipIpcOpenMemHandle", 0);
	assert_int_equal(fake_log[i].a[2], 1); /* opened on our device 1 */
	assert_int_equal(fake_hip_cur, 0);     /* the application's device is back */

	fake_n = 0;
	assert_non_null(td_importer_hip.sync);
	assert_int_equal(td_importer_hip.sync(&m), 0);
	i = fake_find("hipDeviceSynchronize", 0);
	assert_true(i >= 0);
	assert_int_equal(fake_log[i].a[0], 1);
	assert_int_equal(fake_hip_cur, 0);

	fake_n = 0;
	assert_non_null(td_importer_hip.copy_in);
	assert_int_equal(td_importer_hip.copy_in(&m, src, 1000), 0);
	i = fake_find("hipMemcpyAsync", 0);
	assert_true(i >= 0);
	assert_int_equal(fake_log[i].a[0], (uintptr_t)m.data);
	assert_int_equal(fake_log[i].a[1], (uintptr_t)src);
	assert_int_equal(fake_log[i].a[2], 1000);
	assert_int_equal(fake_log[i].a[3], (uint64_t)td_gpu_put_stream(TD_GPU_DL_ROCM));
	assert_int_equal(fake_log[i + 1].a[0], hipMemcpyDefault);
	assert_int_equal(fake_log[i + 1].a[1], 1);
	assert_true(fake_find("hipStreamSynchronize", i) > i);
	assert_int_equal(fake_hip_cur, 0);
	td_importer_hip.unmap(&m);
	assert_int_equal(fake_count("hipIpcCloseMemHandle"), 1);
	assert_int_equal(fake_hip_cur, 0);
}

/* --- what a create sends ----------------------------------------------------- */

struct fake_daemon {
	int fd;
	Tensord__Device seen; /* the Create's device */
	uint8_t uuid[16];
	size_t uuid_len;
};

/* Answers one request: records a Create's device, refuses it with -ENOSPC. */
static void *fake_daemon_run(void *arg)
{
	struct fake_daemon *fd = arg;
	uint8_t hdr[TD_FRAME_HEADER], *body, out[256];
	Tensord__Reply rep = TENSORD__REPLY__INIT;
	Tensord__Request *req;
	uint32_t len;
	size_t n;

	if (recv(fd->fd, hdr, sizeof(hdr), MSG_WAITALL) != (ssize_t)sizeof(hdr))
		return NULL;
	memcpy(&len, hdr, 4);
	body = malloc(len);
	if (recv(fd->fd, body, len, MSG_WAITALL) != (ssize_t)len)
		return NULL;
	req = tensord__request__unpack(NULL, len, body);
	free(body);
	if (req && req->body_case == TENSORD__REQUEST__BODY_CREATE && req->create->device) {
		fd->seen = *req->create->device;
		fd->uuid_len = req->create->device->uuid.len;
		memcpy(fd->uuid, req->create->device->uuid.data,
		       fd->uuid_len <= 16 ? fd->uuid_len : 16);
	}
	rep.id = req ? req->id : 0;
	rep.status = -ENOSPC;
	rep.message = "fake daemon: no room";
	n = tensord__reply__pack(&rep, out + TD_FRAME_HEADER);
	td_frame_header(out, (uint32_t)n, 0);
	send(fd->fd, out, TD_FRAME_HEADER + n, MSG_NOSIGNAL);
	tensord__request__free_unpacked(req, NULL);
	return NULL;
}

static void test_put_sends_source_uuid(void **state)
{
	int64_t shape[1] = { 4 };
	float *src = (float *)(uintptr_t)0x60000000; /* never read: the daemon refuses */
	DLTensor dl = { .data = src,
			.device = { kDLCUDA, 0 },
			.ndim = 1,
			.dtype = { kDLFloat, 32, 1 },
			.shape = shape };
	struct fake_daemon fd = { 0 };
	tensord_client *c;
	pthread_t th;
	int sp[2];

	assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sp), 0);
	fd.fd = sp[1];
	c = td_client_new(sp[0]);
	assert_int_equal(pthread_create(&th, NULL, fake_daemon_run, &fd), 0);
	/* put() of our cuda:0 creates on the GPU with our cuda:0's UUID. */
	assert_int_equal(tensord_put(c, "x", &dl, 0, 0), -ENOSPC);
	pthread_join(th, NULL);
	assert_int_equal(fd.seen.type, kDLCUDA);
	assert_int_equal(fd.seen.id, 0);
	assert_int_equal(fd.uuid_len, 16);
	assert_memory_equal(fd.uuid, fake_uuid[0], 16);
	assert_memory_equal(fd.uuid, daemon_uuid(1), 16);
	tensord_close(c);
	close(sp[1]);
}

/* A device this process does not have never reaches the daemon. */
static void test_create_unknown_local_device(void **state)
{
	int64_t shape[1] = { 4 };
	tensord_spec spec = {
		.dtype = { kDLFloat, 32, 1 }, .ndim = 1, .shape = shape, .device = { kDLCUDA, 5 }
	};
	DLManagedTensorVersioned *t;
	tensord_client *c;
	int sp[2];
	char b;

	assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sp), 0);
	c = td_client_new(sp[0]);
	assert_int_equal(tensord_create(c, "x", &spec, &t), -ENODEV);
	assert_non_null(strstr(tensord_last_error(), "tensor 'x'"));
	assert_non_null(strstr(tensord_last_error(), "cuda:5"));
	assert_int_equal(recv(sp[1], &b, 1, MSG_DONTWAIT), -1);
	tensord_close(c);
	close(sp[1]);
}

/* --- fork ----------------------------------------------------------------- */

/* In the forked child: a failed check ends it with status 1 and says which. */
#define CHILD_CHECK(cond)                                                                          \
	do {                                                                                       \
		if (!(cond)) {                                                                     \
			fprintf(stderr, "child: %s:%d: %s\n", __FILE__, __LINE__, #cond);          \
			_exit(1);                                                                  \
		}                                                                                  \
	} while (0)

/*
 * A child forked from a process holding GPU leases makes no driver call:
 * dropping the inherited handles and closing the inherited client touch
 * neither the driver nor the parent's socket, and a new GPU request is
 * refused naming the fork. The parent afterwards unmaps as usual.
 */
static void test_forked_child_makes_no_driver_call(void **state)
{
	DLManagedTensorVersioned *ipc, *hip, *vmm;
	struct wire w1, w2, w3;
	tensord_client *c;
	uint8_t uuid[16];
	int sp[2], pfd[2], st;
	pid_t pid;
	char b;

	assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sp), 0);
	c = td_client_new(sp[0]);
	wire_fill(&w1, TENSORD__HANDLE_KIND__HANDLE_CUDA_IPC, kDLCUDA, 0, 16, false);
	ipc = lease(c, &w1, -1);
	wire_fill(&w2, TENSORD__HANDLE_KIND__HANDLE_HIP_IPC, kDLROCM, 1, 16, false);
	w2.info.id = 43;
	w2.l.lease = 8;
	hip = lease(c, &w2, -1);
	wire_fill(&w3, TENSORD__HANDLE_KIND__HANDLE_CUDA_VMM_FD, kDLCUDA, 1, 16, false);
	w3.info.id = 44;
	w3.l.lease = 9;
	assert_int_equal(pipe(pfd), 0);
	close(pfd[1]);
	vmm = lease(c, &w3, pfd[0]);

	pid = fork();
	assert_true(pid >= 0);
	if (pid == 0) {
		fake_n = 0;
		ipc->deleter(ipc);
		hip->deleter(hip);
		vmm->deleter(vmm);
		tensord_close(c);
		CHILD_CHECK(fake_n == 0);
		CHILD_CHECK(td_gpu_device_uuid((DLDevice){ kDLCUDA, 0 }, uuid) == -ENODEV);
		CHILD_CHECK(strstr(tensord_last_error(), "forked from process"));
		CHILD_CHECK(fake_n == 0);
		_exit(0);
	}
	assert_int_equal(waitpid(pid, &st, 0), pid);
	assert_true(WIFEXITED(st));
	assert_int_equal(WEXITSTATUS(st), 0);
	/* The parent said it forked holding leases (docs/recycle.md, "Fork"):
	 * one Release with forked set and no lease; the child sent nothing and
	 * did not end the connection. */
	{
		uint8_t fr[64];
		uint32_t plen;
		Tensord__Request *req;

		assert_int_equal(recv(sp[1], fr, TD_FRAME_HEADER, MSG_DONTWAIT), TD_FRAME_HEADER);
		memcpy(&plen, fr, sizeof(plen));
		assert_true(plen <= sizeof(fr));
		assert_int_equal(recv(sp[1], fr, plen, MSG_DONTWAIT), (ssize_t)plen);
		req = tensord__request__unpack(NULL, plen, fr);
		assert_non_null(req);
		assert_int_equal(req->body_case, TENSORD__REQUEST__BODY_RELEASE);
		assert_int_equal(req->release->lease, 0);
		assert_true(req->release->forked);
		tensord__request__free_unpacked(req, NULL);
	}
	assert_int_equal(recv(sp[1], &b, 1, MSG_DONTWAIT), -1);
	assert_int_equal(errno, EAGAIN);
	/* The parent's handles are its own, as before. */
	fake_n = 0;
	ipc->deleter(ipc);
	hip->deleter(hip);
	vmm->deleter(vmm);
	assert_int_equal(fake_count("cuIpcCloseMemHandle"), 1);
	assert_int_equal(fake_count("hipIpcCloseMemHandle"), 1);
	assert_int_equal(fake_count("cuMemUnmap"), 1);
	assert_int_equal(td_gpu_device_uuid((DLDevice){ kDLCUDA, 0 }, uuid), 0);
	tensord_close(c);
	close(sp[1]);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(test_uuid_translation, setup, teardown),
		cmocka_unit_test_setup_teardown(test_uuid_not_visible, setup, teardown),
		cmocka_unit_test_setup_teardown(test_hip_without_uuids, setup, teardown),
		cmocka_unit_test_setup_teardown(test_lease_device_is_local, setup, teardown),
		cmocka_unit_test_setup_teardown(test_zero_size_gpu_lease, setup, teardown),
		cmocka_unit_test_setup_teardown(test_close_unmaps_ipc_first, setup, teardown),
		cmocka_unit_test_setup_teardown(test_close_sends_queued_releases, setup, teardown),
		cmocka_unit_test_setup_teardown(test_ipc_kinds_agree, setup, teardown),
		cmocka_unit_test_setup_teardown(test_vmm_one_import_per_process, setup, teardown),
		cmocka_unit_test_setup_teardown(test_ipc_one_open_per_process, setup, teardown),
		cmocka_unit_test_setup_teardown(test_vmm_reader_read_only, setup, teardown),
		cmocka_unit_test_setup_teardown(test_vmm_creator_protected_at_publish, setup,
						teardown),
		cmocka_unit_test_setup_teardown(test_vmm_access_for_peers, setup, teardown),
		cmocka_unit_test_setup_teardown(test_vmm_peers_refused, setup, teardown),
		cmocka_unit_test_setup_teardown(test_vmm_read_only_fallback_with_peers, setup,
						teardown),
		cmocka_unit_test_setup_teardown(test_cuda_copy_in_on_put_stream, setup, teardown),
		cmocka_unit_test_setup_teardown(test_hip_sync_and_copy_in, setup, teardown),
		cmocka_unit_test_setup_teardown(test_put_sends_source_uuid, setup, teardown),
		cmocka_unit_test_setup_teardown(test_create_unknown_local_device, setup, teardown),
		cmocka_unit_test_setup_teardown(test_forked_child_makes_no_driver_call, setup,
						teardown),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
