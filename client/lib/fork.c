/*
 * libtensord across fork() (docs/design.md, "Fork"): the list of every live
 * client of this process, and the pthread_atfork() handlers that keep each
 * client whole through a fork and, in the child, make it let go of its
 * parent's connection. td_client_current() then connects the child anew.
 */
#include <errno.h>
#include <stdio.h>
#include <unistd.h>

#include "client.h"

/* Every live client of this process, for fork() (docs/design.md, "Fork"). */
static pthread_mutex_t all_lock = PTHREAD_MUTEX_INITIALIZER;
static LIST_HEAD(, tensord_client) all_clients = LIST_HEAD_INITIALIZER(all_clients);
static pthread_once_t atfork_once = PTHREAD_ONCE_INIT;

/*
 * fork(). Before it, the forking thread takes the list's lock, then each
 * client's lock and send lock (in that order, as everywhere), so that the
 * child copies every client whole; the parent then lets go.
 */
static void atfork_prepare(void)
{
	tensord_client *c;

	pthread_mutex_lock(&all_lock);
	LIST_FOREACH(c, &all_clients, all_link)
	{
		pthread_mutex_lock(&c->lock);
		pthread_mutex_lock(&c->conn.send_lock);
	}
}

static void atfork_parent(void)
{
	tensord_client *c;

	LIST_FOREACH(c, &all_clients, all_link)
	{
		/* The child keeps what this client's leases map, and reads it
		 * without a lease of its own: the daemon must never recycle it. */
		if (!c->inherited && !c->conn.closed && atomic_load(&c->refs) > 1)
			td_relq_forked_locked(&c->conn);
		pthread_mutex_unlock(&c->conn.send_lock);
		pthread_mutex_unlock(&c->lock);
	}
	pthread_mutex_unlock(&all_lock);
}

/*
 * In the child, c is a copy of its parent's client: it keeps only what its
 * leases need (the mappings) and lets go of everything else without a word
 * to the daemon. Only this thread exists here, so nothing is contended.
 */
static void forget_parent(tensord_client *c)
{
	struct td_conn *conn = &c->conn;

	/* atfork_prepare() took both locks in the thread this child is a copy
	 * of; the condition variable's waiters were other threads of the
	 * parent, which the child does not have. */
	pthread_mutex_unlock(&conn->send_lock);
	pthread_mutex_unlock(&c->lock);
	pthread_cond_init(&conn->cond, NULL);
	c->inherited = true;
	/* The daemon must see the connection end when the parent ends it. */
	if (conn->fd >= 0)
		close(conn->fd);
	conn->fd = -1;
	td_fdq_clear(&conn->fdq);
	conn->closed = true;
	conn->err = -ENOTCONN;
	snprintf(conn->why, sizeof(conn->why),
		 "the connection belongs to the process this one "
		 "was forked from");
	/* They live on the stacks of the parent's threads, which the child's
	 * memory copies: a descriptor a reply brought them is closed here. */
	for (struct td_pending *p = conn->pending; p; p = p->next) {
		if (p->done && p->fd >= 0)
			close(p->fd);
		for (struct td_part *part = p->parts; part; part = part->next)
			for (unsigned i = 0; i < part->n_fds; i++)
				close(part->fds[i]);
	}
	conn->pending = NULL;
	conn->reading = false;
	/* The parent's releases, and a flusher that was not copied. */
	conn->relq.n = 0;
	conn->relq.running = false;
	td_mapcache_after_fork(&c->maps);
	td_reserve_after_fork(&c->reserve);
	td_ring_after_fork(&c->ring);
	td_bindings_after_fork(c);
}

static void atfork_child(void)
{
	tensord_client *c;

	if (td_gpu_in_use())
		td_gpu_forked_from = (int)getppid();
	atomic_fetch_add(&td_forks, 1);
	LIST_FOREACH(c, &all_clients, all_link)
	forget_parent(c);
	pthread_mutex_unlock(&all_lock);
}

static void atfork_register(void)
{
	pthread_atfork(atfork_prepare, atfork_parent, atfork_child);
}

void td_fork_track(tensord_client *c)
{
	pthread_once(&atfork_once, atfork_register);
	pthread_mutex_lock(&all_lock);
	LIST_INSERT_HEAD(&all_clients, c, all_link);
	pthread_mutex_unlock(&all_lock);
}

void td_fork_untrack(tensord_client *c)
{
	pthread_mutex_lock(&all_lock);
	LIST_REMOVE(c, all_link);
	pthread_mutex_unlock(&all_lock);
}
