/*
 * libtensord: the per-client mapping cache. Mappings are keyed by tensor id
 * and found by name while any lease uses them; the importer that made one
 * unmaps it when its last lease ends. Unmapping happens outside the lock.
 */
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "mapcache.h"

void td_mapcache_init(struct td_mapcache *mc, pthread_mutex_t *lock)
{
	mc->lock = lock;
	mc->maps = NULL;
	mc->n_shares = 0;
}

void td_mapcache_fini(struct td_mapcache *mc)
{
	for (int i = 0; i < mc->n_shares; i++)
		close(mc->shares[i].fd);
	mc->n_shares = 0;
}

void td_mapcache_share_add(struct td_mapcache *mc, uint64_t id, int fd)
{
	pthread_mutex_lock(mc->lock);
	for (int i = 0; i < mc->n_shares; i++) {
		if (mc->shares[i].id == id) {
			pthread_mutex_unlock(mc->lock);
			close(fd);
			return;
		}
	}
	if (mc->n_shares == TD_SHARES_MAX) {
		pthread_mutex_unlock(mc->lock);
		close(fd);
		return;
	}
	mc->shares[mc->n_shares].id = id;
	mc->shares[mc->n_shares].fd = fd;
	mc->n_shares++;
	pthread_mutex_unlock(mc->lock);
}

int td_mapcache_share_fd(struct td_mapcache *mc, uint64_t id)
{
	int fd = -1;

	pthread_mutex_lock(mc->lock);
	for (int i = 0; i < mc->n_shares; i++) {
		if (mc->shares[i].id == id) {
			fd = fcntl(mc->shares[i].fd, F_DUPFD_CLOEXEC, 3);
			break;
		}
	}
	pthread_mutex_unlock(mc->lock);
	return fd;
}

size_t td_mapcache_share_ids(struct td_mapcache *mc, uint64_t *ids, size_t max)
{
	size_t n = 0;

	pthread_mutex_lock(mc->lock);
	for (int i = 0; i < mc->n_shares && n < max; i++)
		ids[n++] = mc->shares[i].id;
	pthread_mutex_unlock(mc->lock);
	return n;
}

void td_mapcache_insert(struct td_mapcache *mc, struct td_mapping *m)
{
	pthread_mutex_lock(mc->lock);
	m->refs = 1;
	m->next = mc->maps;
	mc->maps = m;
	pthread_mutex_unlock(mc->lock);
}

struct td_mapping *td_mapcache_find_reusable(struct td_mapcache *mc, const char *name)
{
	struct td_mapping *m;

	pthread_mutex_lock(mc->lock);
	for (m = mc->maps; m; m = m->next) {
		if (m->reusable && strcmp(m->name, name) == 0) {
			m->refs++;
			break;
		}
	}
	pthread_mutex_unlock(mc->lock);
	return m;
}

struct td_mapping *td_mapcache_find_created(struct td_mapcache *mc, const char *name)
{
	struct td_mapping *m;

	pthread_mutex_lock(mc->lock);
	for (m = mc->maps; m; m = m->next) {
		if (m->created_here && m->writable && strcmp(m->name, name) == 0) {
			m->refs++;
			break;
		}
	}
	pthread_mutex_unlock(mc->lock);
	return m;
}

void td_mapcache_mark_published(struct td_mapcache *mc, struct td_mapping *m, bool private_view)
{
	pthread_mutex_lock(mc->lock);
	if (private_view)
		m->reusable = false;
	m->writable = false;
	pthread_mutex_unlock(mc->lock);
}

/* Needs unmapping before the daemon may free it, and is still mapped. Lock held. */
static bool must_revoke(const struct td_mapping *m)
{
	const struct td_importer *imp = td_importer_for(m->handle_kind);

	return imp && imp->unmap_before_close && !m->revoked;
}

int td_mapcache_revoke(struct td_mapcache *mc)
{
	struct td_mapping **v = NULL, *m;
	int n = 0, i = 0;

	pthread_mutex_lock(mc->lock);
	for (m = mc->maps; m; m = m->next)
		n += must_revoke(m);
	v = n ? malloc((size_t)n * sizeof(*v)) : NULL;
	/* Without memory for the list, unmap under the lock: it must happen. */
	for (m = mc->maps; m && n; m = m->next) {
		if (!must_revoke(m))
			continue;
		m->revoked = true;
		if (v) {
			m->refs++;
			v[i++] = m;
		} else {
			td_importer_for(m->handle_kind)->unmap(m);
		}
	}
	pthread_mutex_unlock(mc->lock);
	for (int k = 0; k < i; k++) {
		td_importer_for(v[k]->handle_kind)->unmap(v[k]);
		td_mapcache_unref(mc, v[k]);
	}
	free(v);
	return n;
}

void td_mapcache_unref(struct td_mapcache *mc, struct td_mapping *m)
{
	const struct td_importer *imp;

	pthread_mutex_lock(mc->lock);
	if (--m->refs) {
		pthread_mutex_unlock(mc->lock);
		return;
	}
	for (struct td_mapping **pm = &mc->maps; *pm; pm = &(*pm)->next) {
		if (*pm == m) {
			*pm = m->next;
			break;
		}
	}
	pthread_mutex_unlock(mc->lock);
	imp = td_importer_for(m->handle_kind);
	if (imp && !m->revoked)
		imp->unmap(m);
	free(m);
}
