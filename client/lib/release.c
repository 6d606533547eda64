/*
 * libtensord: deferred releases. A deleter does not send its Release at
 * once: it queues the lease id, and the queue goes out in front of the
 * next request, in the same send(), or after at most TD_RELQ_DELAY_NS when
 * no request comes (a flusher thread per client), or at once when
 * TD_RELQ_MAX are waiting. In the common attach, use, release, attach
 * loop the daemon then wakes once per cycle instead of twice; waking a
 * process costs more than the rest of an attach on a VM.
 *
 * What others see: another connection sees a lease end up to
 * TD_RELQ_DELAY_NS later (Release was never acknowledged, so nobody could
 * rely on it being immediate); this connection's own requests always
 * reach the daemon after the releases queued before them. A lease whose
 * connection is gone was ended by the daemon already, so a queued Release
 * that cannot be sent is simply dropped.
 *
 * The same thread expires the mappings the cache parked (mapcache.h) when
 * they fall due, so that an idle process lets them go too, and the GPU
 * imports parked between versions (import_gpu.h).
 *
 * Releases of leases on recycled GPU memory (docs/recycle.md, section 4)
 * wait in a queue of their own: the flusher waits for their devices
 * (cuCtxSynchronize), then sends them. A deleter runs as soon as torch
 * drops an array, with kernels that read it possibly still queued, and the
 * writer's next version may go into the same allocation once the daemon
 * has the Release: so the Release must not leave before those kernels
 * ended, and the caller must not wait for them. What it costs: the
 * daemon sees such a lease end a device sync later (what was queued on
 * the device when the flusher looked, every stream of the context); a
 * writer whose readers' devices stay busy finds the buffer still leased
 * and takes another. What it relies on: the consumer's work runs in the
 * device's primary context (torch, cupy and the runtime's), as publish's
 * sync does (docs/gpu.md, "The stream contract").
 */
#include <errno.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "client.h"
#include "import_gpu.h"
#include "proto/frame.h"

#define TD_RELQ_DELAY_NS 1000000ull /* 1 ms */
/* How often a client holding leases looks whether its daemon went (readopt.c). */
#define TD_LOST_CHECK_NS (200ull * 1000000ull)
/* How long after its last lease it goes on looking before it sleeps until woken. */
#define TD_LIVE_KEEP_NS (10ull * 1000000000ull)

static uint64_t mono_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

size_t td_relq_drain(struct td_relq *q, uint8_t *end)
{
	uint8_t tmp[TD_RELQ_MAX * TD_RELEASE_FRAME_MAX];
	size_t n = 0;

	for (int i = 0; i < q->n; i++) {
		Tensord__Request req = TENSORD__REQUEST__INIT;
		Tensord__Release rel = TENSORD__RELEASE__INIT;
		size_t plen;

		rel.lease = q->ids[i];
		rel.forked = q->ids[i] == 0; /* td_relq_forked_locked()'s */
		req.body_case = TENSORD__REQUEST__BODY_RELEASE;
		req.release = &rel;
		plen = tensord__request__get_packed_size(&req);
		/* At most 13 bytes: a varint in a message in a message. */
		td_frame_header(tmp + n, (uint32_t)plen, 0);
		tensord__request__pack(&req, tmp + n + TD_FRAME_HEADER);
		n += TD_FRAME_HEADER + plen;
	}
	q->n = 0;
	memcpy(end - n, tmp, n);
	return n;
}

/* Sends what is queued. send_lock held. */
static void flush_locked(struct td_conn *conn)
{
	uint8_t buf[TD_RELQ_MAX * TD_RELEASE_FRAME_MAX];
	size_t n = td_relq_drain(&conn->relq, buf + sizeof(buf));
	char saved[512];

	/* A failure means the connection is gone, and the daemon has ended
	 * these leases already; keep the caller's error message. */
	snprintf(saved, sizeof(saved), "%s", tensord_last_error());
	td_conn_send_locked(conn, buf + sizeof(buf) - n, n);
	td_set_error(0, "%s", saved);
}

static tensord_client *client_of(struct td_conn *conn)
{
	return (tensord_client *)((char *)conn - offsetof(tensord_client, conn));
}

/* send_lock held. Sweeps parked mappings if due; true if it dropped the lock to do so. */
static bool sweep_if_due(struct td_conn *conn, uint64_t now)
{
	struct td_relq *q = &conn->relq;
	uint64_t due;

	if (q->sweep_kicked) {
		q->sweep_kicked = false;
		if (!q->sweep_due)
			q->sweep_due = now + TD_PARK_NS;
	}
	if (!q->sweep_due || now < q->sweep_due)
		return false;
	/* The cache's lock is never taken inside send_lock. */
	pthread_mutex_unlock(&conn->send_lock);
	due = td_mapcache_sweep(q->maps);
	pthread_mutex_lock(&conn->send_lock);
	q->sweep_due = due;
	return true;
}

/* send_lock held. Gives back idle ring buffers if due; true if it dropped the lock to do so. */
static bool ring_if_due(struct td_conn *conn, uint64_t now)
{
	struct td_relq *q = &conn->relq;
	tensord_client *c = client_of(conn);
	uint64_t due;

	if (!q->ring_due || now < q->ring_due)
		return false;
	q->ring_due = 0;
	/* The client's lock is never taken inside send_lock. */
	pthread_mutex_unlock(&conn->send_lock);
	due = td_ring_sweep(c);
	pthread_mutex_lock(&conn->send_lock);
	if (due && (!q->ring_due || due < q->ring_due))
		q->ring_due = due;
	return true;
}

void td_relq_ring_due(struct td_conn *conn, uint64_t due)
{
	struct td_relq *q = &conn->relq;

	pthread_mutex_lock(&conn->send_lock);
	if (q->running && (!q->ring_due || due < q->ring_due)) {
		q->ring_due = due;
		pthread_cond_signal(&q->cond);
	}
	pthread_mutex_unlock(&conn->send_lock);
}

/*
 * send_lock held. While the client holds leases, or did within
 * TD_LIVE_KEEP_NS, looks every TD_LOST_CHECK_NS whether the daemon went
 * (td_client_idle_check()); true if it dropped the lock to do so.
 */
static bool lost_if_due(struct td_conn *conn, uint64_t now)
{
	struct td_relq *q = &conn->relq;
	tensord_client *c = client_of(conn);

	if (atomic_load(&c->n_live))
		q->live_ns = now;
	if (!q->live_ns || now - q->live_ns >= TD_LIVE_KEEP_NS) {
		q->lost_due = 0; /* not watching */
		return false;
	}
	if (!q->lost_due)
		q->lost_due = now + TD_LOST_CHECK_NS;
	if (now < q->lost_due)
		return false;
	q->lost_due = now + TD_LOST_CHECK_NS;
	if (!atomic_load(&c->n_live))
		return false; /* nothing to re-adopt */
	/* The client's lock is never taken inside send_lock. */
	pthread_mutex_unlock(&conn->send_lock);
	td_client_idle_check(c);
	pthread_mutex_lock(&conn->send_lock);
	return true;
}

void td_relq_live(tensord_client *c)
{
	struct td_conn *conn = &c->conn;

	/* Seen by the flusher before it sleeps, or it sees n_live. */
	if (atomic_load(&conn->relq.watching))
		return;
	pthread_mutex_lock(&conn->send_lock);
	pthread_cond_signal(&conn->relq.cond);
	pthread_mutex_unlock(&conn->send_lock);
}

/*
 * send_lock held. Sends the releases waiting for a device sync, after it;
 * true if it dropped the lock to do so.
 */
static bool synced_if_any(struct td_conn *conn)
{
	struct td_relq *q = &conn->relq;
	uint64_t ids[TD_RELQ_MAX];
	DLDevice devs[TD_RELQ_MAX];
	int n = q->n_sync;

	if (n == 0)
		return false;
	memcpy(ids, q->sync_ids, (size_t)n * sizeof(ids[0]));
	memcpy(devs, q->sync_devs, (size_t)n * sizeof(devs[0]));
	q->n_sync = 0;
	q->syncing = true;
	pthread_mutex_unlock(&conn->send_lock);
	/* One wait per device: it covers every lease queued before it. */
	for (int i = 0; i < n; i++) {
		bool seen = false;

		for (int j = 0; j < i && !seen; j++)
			seen = devs[j].device_type == devs[i].device_type &&
			       devs[j].device_id == devs[i].device_id;
		if (!seen)
			(void)td_gpu_device_sync(devs[i].device_type, devs[i].device_id);
	}
	pthread_mutex_lock(&conn->send_lock);
	for (int i = 0; i < n; i++) {
		if (q->n == TD_RELQ_MAX)
			flush_locked(conn);
		q->ids[q->n++] = ids[i];
	}
	flush_locked(conn);
	q->syncing = false;
	pthread_cond_broadcast(&q->cond); /* td_relq_flush() may wait for these */
	return true;
}

/* send_lock held. Undoes the parked GPU imports due; true if it dropped the lock to do so. */
static bool gpu_if_due(struct td_conn *conn, uint64_t now)
{
	struct td_relq *q = &conn->relq;
	uint64_t due;

	if (!q->gpu_due || now < q->gpu_due)
		return false;
	pthread_mutex_unlock(&conn->send_lock);
	due = td_gpu_parked_sweep(now);
	pthread_mutex_lock(&conn->send_lock);
	q->gpu_due = due;
	return true;
}

static void wait_until(struct td_conn *conn, uint64_t due)
{
	struct timespec ts = { .tv_sec = (time_t)(due / 1000000000ull),
			       .tv_nsec = (long)(due % 1000000000ull) };

	pthread_cond_timedwait(&conn->relq.cond, &conn->send_lock, &ts);
}

static void *flusher(void *arg)
{
	struct td_conn *conn = arg;
	struct td_relq *q = &conn->relq;

	pthread_mutex_lock(&conn->send_lock);
	while (!q->stop) {
		uint64_t now = mono_ns(), due;

		if (synced_if_any(conn) || sweep_if_due(conn, now) || ring_if_due(conn, now) ||
		    gpu_if_due(conn, now) || lost_if_due(conn, now))
			continue;
		if (q->n == 0) {
			/* Idle: the next deleter wakes us, or the next expiry. */
			uint64_t next = q->sweep_due;

			if (q->ring_due && (!next || q->ring_due < next))
				next = q->ring_due;
			if (q->lost_due && (!next || q->lost_due < next))
				next = q->lost_due;
			if (q->gpu_due && (!next || q->gpu_due < next))
				next = q->gpu_due;
			q->armed = false;
			/* Not watching: a lease that comes meanwhile wakes us
			 * (td_relq_live()), or one that came is watched now. */
			atomic_store(&q->watching, q->lost_due != 0);
			if (!q->lost_due && atomic_load(&client_of(conn)->n_live))
				continue;
			if (next)
				wait_until(conn, next);
			else
				pthread_cond_wait(&q->cond, &conn->send_lock);
			continue;
		}
		/* Timing the queue: deleters need not wake us meanwhile, so a
		 * busy client costs this thread about one wake-up a delay. */
		q->armed = true;
		due = q->since_ns + TD_RELQ_DELAY_NS;
		if (now < due) {
			wait_until(conn, due);
			continue;
		}
		flush_locked(conn);
	}
	pthread_mutex_unlock(&conn->send_lock);
	return NULL;
}

/* The cache parked a mapping while none was: the flusher times its expiry. */
static void on_park(void *arg)
{
	struct td_conn *conn = arg;

	pthread_mutex_lock(&conn->send_lock);
	/* Already timing an expiry: that sweep will see this one too. */
	if (!conn->relq.sweep_due && !conn->relq.sweep_kicked) {
		conn->relq.sweep_kicked = true;
		pthread_cond_signal(&conn->relq.cond);
	}
	pthread_mutex_unlock(&conn->send_lock);
}

void td_relq_start(struct td_conn *conn, struct td_mapcache *maps)
{
	struct td_relq *q = &conn->relq;
	pthread_condattr_t attr;

	pthread_condattr_init(&attr);
	pthread_condattr_setclock(&attr, CLOCK_MONOTONIC);
	pthread_cond_init(&q->cond, &attr);
	pthread_condattr_destroy(&attr);
	q->n = 0;
	q->stop = false;
	q->armed = false;
	q->maps = maps;
	q->sweep_kicked = false;
	q->sweep_due = 0;
	q->ring_due = 0;
	q->lost_due = 0;
	q->live_ns = 0;
	atomic_init(&q->watching, false);
	q->n_sync = 0;
	q->syncing = false;
	q->gpu_due = 0;
	/* Without a flusher, deleters send at once: slower, never wrong; and
	 * nothing would expire parked mappings, so none are parked. */
	q->running = pthread_create(&q->thread, NULL, flusher, conn) == 0;
	if (!q->running) {
		pthread_cond_destroy(&q->cond);
		return;
	}
	pthread_mutex_lock(maps->lock);
	maps->on_park = on_park;
	maps->on_park_arg = conn;
	pthread_mutex_unlock(maps->lock);
}

void td_relq_stop(struct td_conn *conn)
{
	struct td_relq *q = &conn->relq;

	if (!q->running)
		return;
	pthread_mutex_lock(&conn->send_lock);
	q->stop = true;
	pthread_cond_signal(&q->cond);
	pthread_mutex_unlock(&conn->send_lock);
	pthread_join(q->thread, NULL);
	pthread_cond_destroy(&q->cond);
	q->running = false;
	/* The connection ends these leases: the devices finish first, as the
	 * flusher would have waited; and no import stays parked on its account. */
	pthread_mutex_lock(&conn->send_lock);
	(void)synced_if_any(conn);
	pthread_mutex_unlock(&conn->send_lock);
	(void)td_gpu_parked_sweep(UINT64_MAX);
}

void td_relq_flush(struct td_conn *conn)
{
	pthread_mutex_lock(&conn->send_lock);
	/* Releases of recycled GPU memory too, after their devices' sync:
	 * the connection's end would end those leases without it (also those
	 * the flusher is syncing for now). */
	while (conn->relq.running && conn->relq.syncing)
		pthread_cond_wait(&conn->relq.cond, &conn->send_lock);
	(void)synced_if_any(conn);
	if (conn->relq.n)
		flush_locked(conn);
	pthread_mutex_unlock(&conn->send_lock);
}

void td_relq_forked_locked(struct td_conn *conn)
{
	struct td_relq *q = &conn->relq;

	if (q->n == TD_RELQ_MAX)
		flush_locked(conn);
	q->ids[q->n++] = 0;
	flush_locked(conn);
}

void td_release(tensord_client *c, uint64_t lease_id)
{
	struct td_conn *conn = &c->conn;
	struct td_relq *q = &conn->relq;

	/* A lease inherited across fork() is the parent's to end. */
	if (c->inherited)
		return;

	pthread_mutex_lock(&conn->send_lock);
	if (!q->running) {
		pthread_mutex_unlock(&conn->send_lock);
		Tensord__Request req = TENSORD__REQUEST__INIT;
		Tensord__Release rel = TENSORD__RELEASE__INIT;

		rel.lease = lease_id;
		req.body_case = TENSORD__REQUEST__BODY_RELEASE;
		req.release = &rel;
		td_send_oneway(c, &req);
		return;
	}
	if (q->n == TD_RELQ_MAX)
		flush_locked(conn);
	if (q->n == 0) {
		q->since_ns = mono_ns();
		if (!q->armed)
			pthread_cond_signal(&q->cond);
	}
	q->ids[q->n++] = lease_id;
	pthread_mutex_unlock(&conn->send_lock);
}

bool td_release_needs_sync(const struct td_mapping *m, DLDevice *ret_dev)
{
	if (!m || !m->gpu_ring)
		return false;
	*ret_dev = m->device;
	/* td_release_last_of_import() answers for what this thread unmaps next. */
	td_gpu_last_watch();
	return true;
}

bool td_release_last_of_import(bool revoked)
{
	/* tensord_close() unmapped it already, with no sync of ours: wait. */
	return revoked || td_gpu_last_dropped();
}

void td_release_after_sync(tensord_client *c, uint64_t lease_id, DLDevice dev)
{
	struct td_conn *conn = &c->conn;
	struct td_relq *q = &conn->relq;

	if (c->inherited)
		return;
	pthread_mutex_lock(&conn->send_lock);
	if (q->running && q->n_sync < TD_RELQ_MAX) {
		q->sync_ids[q->n_sync] = lease_id;
		q->sync_devs[q->n_sync++] = dev;
		/* Parked imports expire from a park time after this. */
		if (!q->gpu_due)
			q->gpu_due = mono_ns() + td_gpu_park_ns();
		pthread_cond_signal(&q->cond);
		pthread_mutex_unlock(&conn->send_lock);
		return;
	}
	pthread_mutex_unlock(&conn->send_lock);
	/* No flusher, or a full queue: this caller waits, rather than risk the reuse. */
	(void)td_gpu_device_sync(dev.device_type, dev.device_id);
	td_release(c, lease_id);
}
