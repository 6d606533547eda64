/*
 * Remote attach, node B: pulling another node's set (docs/remote.md,
 * "Sets"). One SetPull asks for a list of names or a prefix; A leases
 * every member in one step and answers with their count, then one
 * PullReply per member; each member is a pull (remote_pull.c) whose
 * replica is made in the set's transaction, and all are published in one
 * commit once every member's bytes are in, or none is.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/queue.h>

#include "common/desc.h"
#include "daemon/figures.h"
#include "daemon/base/clock.h"
#include "daemon/base/log.h"
#include "peer.h"
#include "remote_int.h"

/* --- B: pulling a set ------------------------------------------------------------------ */

bool remote_set_is_remote(const Tensord__AttachMany *m)
{
	if (!m->n_names)
		return m->prefix[0] == '@';
	for (size_t i = 0; i < m->n_names; i++)
		if (m->names[i][0] == '@')
			return true;
	return false;
}

static void on_set_closed(uv_handle_t *h)
{
	struct spull *sp = h->data;

	for (size_t i = 0; i < sp->n_names; i++)
		free(sp->names[i]);
	free(sp->names);
	free(sp->members);
	free(sp->have_shares);
	free(sp);
}

static void set_free(struct spull *sp)
{
	LIST_REMOVE(sp, link);
	sp->rm->n_sets--;
	uv_timer_stop(&sp->timer);
	uv_close((uv_handle_t *)&sp->timer, on_set_closed);
}

/*
 * sp failed (why names the peer, the member when one failed, and the
 * reason): cl's AttachMany gets it; the transaction holding the replicas
 * made so far is aborted, so that none is ever seen; every member's pull
 * ends as a failed pull does.
 */
void rm_set_fail(struct spull *sp, int status, const char *why)
{
	struct remote *rm = sp->rm;
	char buf[300];

	log_info("set pull %" PRIu64 " (%s) failed: %s", sp->id, sp->what, why);
	figure_count(FIG_remote_pull_failures_total, 1);
	if (sp->cl)
		rm_reply_status(rm->env, sp->cl, TENSORD__REQUEST__BODY_ATTACH_MANY, sp->req_id,
				status, why);
	/* -ENOENT: no member had been made yet (or the failed commit ended it). */
	registry_tx_abort(rm->env->reg, &rm->rc, sp->tx, buf, sizeof(buf));
	for (uint32_t i = 0; i < sp->count; i++)
		if (sp->members[i])
			rm_pull_end_failed(sp->members[i], status, why);
	set_free(sp);
}

static void on_set_timeout(uv_timer_t *t)
{
	struct spull *sp = t->data;
	char why[500];

	snprintf(why, sizeof(why), "peer %s: %s: no answer after %" PRIu64 " ms", sp->rp->p->name,
		 sp->what, (now_ns() - sp->started_ns) / 1000000u);
	rm_set_fail(sp, -ETIMEDOUT, why);
}

/*
 * The peer of AttachMany m's names (all "@PEER/NAME" of one peer) or of
 * its prefix ("@PEER/" and a prefix of A's names, maybe empty): into peer,
 * its length returned; -errno with the reason.
 */
static int set_peer(const Tensord__AttachMany *m, char *peer, char *why, size_t why_len)
{
	size_t peer_len = 0, pl;
	char reason[300];

	if (!m->n_names) {
		size_t len = strlen(m->prefix);
		char probe[TENSORD_NAME_MAX + 2];

		/* "@PEER/" alone is checked as "@PEER/x" would be: the whole export to us. */
		snprintf(probe, sizeof(probe), "%s%s", m->prefix,
			 len && m->prefix[len - 1] == '/' && !memchr(m->prefix + 1, '/', len - 2)
				 ? "x"
				 : "");
		if (len > TENSORD_NAME_MAX ||
		    td_remote_name_check(probe, strlen(probe), &pl, reason, sizeof(reason)) < 0) {
			snprintf(why, why_len, "attach_many: prefix of another node's set: %s",
				 len > TENSORD_NAME_MAX ? "longer than a name" : reason);
			return -EINVAL;
		}
		memcpy(peer, m->prefix + 1, pl);
		peer[pl] = '\0';
		return (int)pl;
	}
	for (size_t i = 0; i < m->n_names; i++) {
		const char *name = m->names[i];

		if (name[0] != '@') {
			snprintf(why, why_len,
				 "attach_many: '%.260s' is a local name and '%.260s' another "
				 "node's: one set is all of one node",
				 name,
				 m->names[0][0] == '@' ? m->names[0] : m->names[m->n_names - 1]);
			return -EINVAL;
		}
		if (td_remote_name_check(name, strlen(name), &pl, reason, sizeof(reason)) < 0) {
			snprintf(why, why_len, "attach_many: %s", reason);
			return -EINVAL;
		}
		if (i && (pl != peer_len || memcmp(name + 1, peer, pl) != 0)) {
			snprintf(why, why_len,
				 "attach_many: '%.260s' and '%.260s' are of different peers: one "
				 "set is all of one node",
				 m->names[0], name);
			return -EINVAL;
		}
		peer_len = pl;
		memcpy(peer, name + 1, pl);
		peer[pl] = '\0';
	}
	return (int)peer_len;
}

/* sp's names (A's, without "@PEER/") and cl's share ids, copied from m. */
static int set_copy_request(struct spull *sp, const Tensord__AttachMany *m, size_t peer_len)
{
	if (m->n_have_shares) {
		sp->have_shares = malloc(m->n_have_shares * sizeof(uint64_t));
		if (!sp->have_shares)
			return -ENOMEM;
		memcpy(sp->have_shares, m->have_shares, m->n_have_shares * sizeof(uint64_t));
		sp->n_have_shares = m->n_have_shares;
	}
	if (!m->n_names) {
		snprintf(sp->prefix, sizeof(sp->prefix), "%s", m->prefix + peer_len + 2);
		return 0;
	}
	sp->names = calloc(m->n_names, sizeof(char *));
	if (!sp->names)
		return -ENOMEM;
	sp->n_names = m->n_names;
	for (size_t i = 0; i < m->n_names; i++)
		if (!(sp->names[i] = strdup(m->names[i] + peer_len + 2)))
			return -ENOMEM;
	return 0;
}

void remote_attach_many(struct remote_env *env, struct client *cl, uint64_t id,
			const Tensord__AttachMany *m)
{
	struct remote *rm = env->rm;
	Tensord__PeerFrame f = TENSORD__PEER_FRAME__INIT;
	Tensord__PeerSetPull sm = TENSORD__PEER_SET_PULL__INIT;
	char why[700], peer[PEER_NAME_MAX + 1], what[300];
	size_t bytes = 64;
	struct spull *sp;
	struct rpeer *rp;
	int peer_len = set_peer(m, peer, why, sizeof(why));

	if (peer_len < 0) {
		rm_reply_status(env, cl, TENSORD__REQUEST__BODY_ATTACH_MANY, id, peer_len, why);
		return;
	}
	if (m->n_names)
		snprintf(what, sizeof(what), "set of %zu names ('%.200s'%s)", m->n_names,
			 m->names[0], m->n_names > 1 ? ", ..." : "");
	else
		snprintf(what, sizeof(what), "set '%.250s'", m->prefix);
	if (m->after) {
		snprintf(why, sizeof(why),
			 "attach_many of %s: `after` is not supported for another node's set yet "
			 "(attach the set again to get its newest commit)",
			 what);
		rm_reply_status(env, cl, TENSORD__REQUEST__BODY_ATTACH_MANY, id, -EOPNOTSUPP, why);
		return;
	}
	for (size_t i = 0; i < m->n_names; i++)
		bytes += strlen(m->names[i]) + 4;
	if (m->n_names > REMOTE_SET_MAX || bytes > PEER_FRAME_MAX - 128) {
		snprintf(why, sizeof(why),
			 "attach_many of %s: one set pull holds at most %u names and %u bytes of "
			 "them; use a prefix",
			 what, REMOTE_SET_MAX, PEER_FRAME_MAX - 128);
		rm_reply_status(env, cl, TENSORD__REQUEST__BODY_ATTACH_MANY, id, -E2BIG, why);
		return;
	}
	rp = rm_rpeer_ready(env, cl, TENSORD__REQUEST__BODY_ATTACH_MANY, id, what, peer);
	if (!rp)
		return;
	if (rm->n_sets >= REMOTE_SETS_MAX) {
		snprintf(why, sizeof(why),
			 "attach_many of %s: %u sets are being pulled on this node already, the "
			 "most at once; try again",
			 what, REMOTE_SETS_MAX);
		rm_reply_status(env, cl, TENSORD__REQUEST__BODY_ATTACH_MANY, id, -EAGAIN, why);
		return;
	}
	sp = calloc(1, sizeof(*sp));
	if (!sp || set_copy_request(sp, m, (size_t)peer_len) < 0) {
		if (sp) {
			for (size_t i = 0; i < sp->n_names; i++)
				free(sp->names[i]);
			free(sp->names);
			free(sp->have_shares);
			free(sp);
		}
		rm_reply_status(env, cl, TENSORD__REQUEST__BODY_ATTACH_MANY, id, -ENOMEM,
				"out of memory for a remote attach_many");
		return;
	}
	sp->rm = rm;
	sp->rp = rp;
	sp->cl = cl;
	sp->req_id = id;
	snprintf(sp->what, sizeof(sp->what), "%s", what);
	/* Its members' ids follow its own, random as a single pull's. */
	sp->id = rm_pull_new_ids(rm, 1 + REMOTE_SET_MAX);
	sp->tx = ++rm->next_tx ? rm->next_tx : ++rm->next_tx;
	sp->st = SP_ASKING;
	sp->started_ns = now_ns();
	LIST_INSERT_HEAD(&rm->sets, sp, link);
	rm->n_sets++;
	uv_timer_init(env->loop, &sp->timer);
	sp->timer.data = sp;
	uv_timer_start(&sp->timer, on_set_timeout, PULL_BASE_MS, 0);
	sm.id = sp->id;
	sm.n_names = sp->n_names;
	sm.names = sp->names;
	sm.prefix = sp->prefix;
	f.body_case = TENSORD__PEER_FRAME__BODY_SET_PULL;
	f.set_pull = &sm;
	if (peer_send(rp->p, &f) < 0) {
		snprintf(why, sizeof(why), "peer %s: %s: the connection to it was lost", peer,
			 what);
		rm_set_fail(sp, -ECONNRESET, why);
	}
}

static struct spull *set_by_id(struct remote *rm, uint64_t id)
{
	struct spull *sp;

	LIST_FOREACH(sp, &rm->sets, link)
	if (sp->id == id)
		return sp;
	return NULL;
}

/* A's answer to set pull sp: refused, or count members leased, whose PullReplies follow. */
int rm_on_set_pull_reply(struct rpeer *rp, const Tensord__PeerSetPullReply *m, char *why,
			 size_t why_len)
{
	struct remote *rm = rp->rm;
	struct spull *sp = set_by_id(rm, m->id);
	char buf[1024];

	/* A set given up: the members' PullReplies that follow are answered PullDone. */
	if (!sp || sp->st != SP_ASKING || sp->rp != rp)
		return 0;
	if (m->status < 0) {
		/* A's own words: they name A, the member and the reason. */
		snprintf(buf, sizeof(buf), "peer %s: %s: %.500s", rp->p->name, sp->what,
			 m->error && m->error[0] ? m->error : "refused");
		rm_set_fail(sp, m->status >= -4095 ? m->status : -EPROTO, buf);
		return 0;
	}
	if (m->count > REMOTE_SET_MAX) {
		snprintf(why, why_len, "a set of %u members, more than the %u asked for at most",
			 m->count, REMOTE_SET_MAX);
		snprintf(buf, sizeof(buf), "peer %s: %s: it answered %s", rp->p->name, sp->what,
			 why);
		rm_set_fail(sp, -EPROTO, buf);
		return -EPROTO;
	}
	uv_timer_stop(&sp->timer);
	sp->st = SP_PULLING;
	sp->commit_a = m->commit;
	if (m->count == 0) {
		if (sp->cl)
			sp->rm->env->hooks.set_answer(sp->cl, sp->req_id, NULL, 0, sp->have_shares,
						      sp->n_have_shares);
		set_free(sp);
		return 0;
	}
	sp->members = calloc(m->count, sizeof(*sp->members));
	if (!sp->members) {
		snprintf(buf, sizeof(buf), "peer %s: %s: out of memory for %u members", rp->p->name,
			 sp->what, m->count);
		rm_set_fail(sp, -ENOMEM, buf);
		return 0;
	}
	sp->count = m->count;
	for (uint32_t i = 0; i < m->count; i++) {
		struct pull *pl = calloc(1, sizeof(*pl));

		if (!pl) {
			snprintf(buf, sizeof(buf), "peer %s: %s: out of memory for %u members",
				 rp->p->name, sp->what, m->count);
			rm_set_fail(sp, -ENOMEM, buf);
			return 0;
		}
		pl->rm = rm;
		pl->rp = rp;
		pl->id = sp->id + 1 + i;
		pl->st = PL_ASKING;
		pl->started_ns = sp->started_ns;
		pl->set = sp;
		LIST_INIT(&pl->waits);
		LIST_INSERT_HEAD(&rm->pulls, pl, link);
		rm->figs->pulls++;
		uv_timer_init(rm->env->loop, &pl->timer);
		pl->timer.data = pl;
		uv_timer_start(&pl->timer, rm_on_pull_timeout, PULL_BASE_MS, 0);
		sp->members[i] = pl;
	}
	return 0;
}

/* Whether a's name (A's) is one sp asked for. */
static bool set_wants(const struct spull *sp, const char *name)
{
	if (!sp->n_names)
		return strncmp(name, sp->prefix, strlen(sp->prefix)) == 0;
	for (size_t i = 0; i < sp->n_names; i++)
		if (strcmp(sp->names[i], name) == 0)
			return true;
	return false;
}

/*
 * Names set member pl from its PullReply (A's name m->name): "@PEER/NAME",
 * one the set asked for, no other member's, and no other pull's under way
 * (whose replica it would replace). 0, or -errno with pl failed.
 */
int rm_set_member_named(struct pull *pl, const Tensord__PeerPullReply *m)
{
	struct spull *sp = pl->set;
	const char *peer = pl->rp->p->name;
	size_t plen = strlen(peer), len = m->name ? strlen(m->name) : 0;
	char reason[300];
	struct pull *other;

	pl->peer_len = plen;
	if (!len || td_name_check(m->name, len, reason, sizeof(reason)) < 0 ||
	    plen + 2 + len > TENSORD_NAME_MAX || !set_wants(sp, m->name)) {
		rm_pull_fail(pl, -EPROTO,
			     "it answered with a member named '%.255s', which the set "
			     "did not ask for",
			     m->name ? m->name : "");
		return -EPROTO;
	}
	snprintf(pl->name, sizeof(pl->name), "@%s/%s", peer, m->name);
	pl->name_len = plen + 2 + len;
	LIST_FOREACH(other, &pl->rm->pulls, link)
	{
		if (other == pl || other->dead || strcmp(other->name, pl->name) != 0)
			continue;
		rm_pull_fail(pl, other->set == sp ? -EPROTO : -EAGAIN, "%s",
			     other->set == sp ? "it answered with this member twice"
					      : "another pull of it is under way on this node; "
						"try again");
		return other->set == sp ? -EPROTO : -EAGAIN;
	}
	return 0;
}

/*
 * Every member's bytes are in: the replicas published in one commit (the
 * transaction of rm->rc), so that no watcher or attach_many here sees
 * part of the set; cl's AttachMany answered with leases on them all, the
 * attaches waiting on members too; the creator's leases end.
 */
void rm_set_publish(struct spull *sp)
{
	struct remote *rm = sp->rm;
	struct registry *reg = rm->env->reg;
	uint64_t commit = 0, bytes = 0;
	uint32_t published, unlinked;
	const char **names = calloc(sp->count, sizeof(*names));
	char reason[400], why[800];
	int r;

	if (!names) {
		snprintf(why, sizeof(why), "peer %s: %s: out of memory to publish it",
			 sp->rp->p->name, sp->what);
		rm_set_fail(sp, -ENOMEM, why);
		return;
	}
	r = registry_tx_commit(reg, &rm->rc, sp->tx, &commit, &published, &unlinked, reason,
			       sizeof(reason));
	if (r < 0) {
		snprintf(why, sizeof(why), "peer %s: %s: cannot publish its replicas: %s",
			 sp->rp->p->name, sp->what, reason);
		free(names);
		rm_set_fail(sp, r, why);
		return;
	}
	for (uint32_t i = 0; i < sp->count; i++) {
		struct pull *pl = sp->members[i];
		struct tensor *t = registry_lookup(reg, &rm->rc, pl->name, pl->name_len);
		struct replica *rep = rm_replica_find(rm, pl->name);

		names[i] = pl->name;
		bytes += pl->nbytes;
		if (rep) { /* an older replica of the name: this one took its place */
			rm_replica_count(rm, rep, 0, (int64_t)pl->nbytes - (int64_t)rep->nbytes);
			rep->nbytes = pl->nbytes;
		} else if ((rep = calloc(1, sizeof(*rep)))) {
			memcpy(rep->name, pl->name, pl->name_len + 1);
			rep->name_len = pl->name_len;
			rep->rp = pl->rp;
			rep->nbytes = pl->nbytes;
			if (!rm_replica_link(rm, rep)) { /* untracked: unlinked below */
				free(rep);
				rep = NULL;
			}
		}
		if (rep) {
			rep->tensor_id = t ? t->id : 0;
			rep->generation = pl->generation;
			rep->idle_since_ns = 0;
			rep->watched = false; /* A watches no set's members: attaches ask */
		}
	}
	figure_count(FIG_remote_pulls_total, sp->count);
	figure_count(FIG_remote_pull_bytes_total, bytes);
	sp->rp->p->remote.pulled += sp->count;
	sp->rp->p->remote.pulled_bytes += bytes;
	log_debug("%s of peer %s: %u replicas, %" PRIu64 " bytes, commit %" PRIu64
		  " there, %" PRIu64 " here, in %.3f ms",
		  sp->what, sp->rp->p->name, sp->count, bytes, sp->commit_a, commit,
		  (double)(now_ns() - sp->started_ns) / 1e6);
	if (sp->cl)
		sp->rm->env->hooks.set_answer(sp->cl, sp->req_id, names, sp->count, sp->have_shares,
					      sp->n_have_shares);
	free(names);
	for (uint32_t i = 0; i < sp->count; i++) {
		struct pull *pl = sp->members[i];

		rm_answer_local(pl, false);
		/* The client holds its leases now: the creator's goes. */
		registry_release(reg, &rm->rc, pl->lease);
		if (!rm_replica_find(rm, pl->name)) /* untracked: unlinked, its leases keep it */
			registry_unlink(reg, &rm->rc, pl->name, pl->name_len, reason,
					sizeof(reason));
		rm_pull_free(pl);
	}
	sp->count = 0;
	set_free(sp);
}
