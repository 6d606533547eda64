/*
 * What clients' effecting requests did (docs/restart.md, section 5,
 * "Idempotence"): per client token (Hello.token), the results of its last
 * SEQS_PER_TOKEN requests that took effect (Request.seq), so that a client
 * whose connection was lost asks (Resolve) instead of applying a put, a
 * commit or an unlink twice.
 *
 * Kept in memory while the daemon runs, and in the state log (each step's
 * record carries the request that made it, a rewrite carries the table):
 * a restarted daemon of the same lineage answers as its predecessor would.
 * Knows nothing of the registry, sockets or the log's file: dispatch.c
 * arms it around a request and tells it each step's result, state.c logs
 * what it hands out, state_restore.c puts back what the log says.
 *
 * Bounds: SEQS_PER_TOKEN results per token (the oldest evicted), at most
 * SEQS_TOKENS_MAX tokens (the one used least recently with no connection
 * open evicted), 848 bytes a token: at most 3.4 MiB in memory, and in a
 * rewritten log 96 bytes a result. What is evicted is not forgotten
 * silently: Resolve then says it cannot know (ESTALE), never "not applied".
 */
#ifndef TENSORD_SEQS_H
#define TENSORD_SEQS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "record.h"

#define SEQS_PER_TOKEN 16
#define SEQS_TOKENS_MAX 4096

enum seq_kind {
	SEQ_PUBLISHED = 1, /* a Publish or a Put: generation, commit */
	SEQ_COMMITTED = 2, /* a Commit: commit, published, unlinked */
	SEQ_UNLINKED = 3,  /* an Unlink */
	/* In a rewritten log only: */
	SEQ_FLOOR = 8,   /* the token's results below seq were evicted */
	SEQ_EVICTED = 9, /* token 0: the table evicted tokens (unknown ones may have had results) */
};

struct seqs;

/* A new, empty table of at most max_tokens tokens (0: SEQS_TOKENS_MAX); NULL out of memory. */
struct seqs *seqs_new(size_t max_tokens);
void seqs_free(struct seqs *s); /* NULL-safe */

/*
 * A connection of uid said Hello with token: counted open until
 * seqs_close(). 0, -EPERM when another uid's requests use token, -ENOMEM.
 */
int seqs_open(struct seqs *s, uint64_t token, uint32_t uid);
void seqs_close(struct seqs *s, uint64_t token);

/*
 * Around one request (dispatch.c): the effecting request seq of token,
 * made by uid, is under way; the first commit step it makes is its result
 * (seqs_step()). Disarmed after the request, stepped or not.
 */
void seqs_arm(struct seqs *s, uint64_t token, uint32_t uid, uint64_t seq, enum seq_kind kind);
void seqs_disarm(struct seqs *s);
bool seqs_armed(const struct seqs *s);
/* The kind of request armed (SEQ_PUBLISHED, ...); 0: none. */
enum seq_kind seqs_armed_kind(const struct seqs *s);

/*
 * A commit step was made: when a request is armed, it took effect in it,
 * and res (kind aside, which the request's) is remembered under it and
 * the request disarmed; the record of it for the step's log entry is kept
 * until seqs_take_step() takes it. Called for every step, so that a step
 * no request made logs nothing (res may be NULL then).
 */
void seqs_step(struct seqs *s, const struct rec_seq *res);
/* The step's record (state.c logs it), once; NULL: the step was no request's. */
const struct rec_seq *seqs_take_step(struct seqs *s);

/* Remembers e as the log says (state_restore.c): a result, a floor, or the evicted mark. */
void seqs_restore(struct seqs *s, const struct rec_seq *e);

/* A log that could not be read whole: nothing is known, and it says so (ESTALE). */
void seqs_forget_all(struct seqs *s);

/* Every entry a rewritten log carries (results, floors, the evicted mark), to fn. */
void seqs_each(const struct seqs *s, void (*fn)(void *arg, const struct rec_seq *e), void *arg);

/*
 * Resolve: what became of request seq of token, asked by uid over a
 * connection of this daemon; other_instance: the request went to another
 * instance (the one before a restart), so none of it can still be under
 * way here. 1: applied, *ret its result; 0: not applied, and never will
 * be; -ESTALE: cannot know (evicted, or a connection of the token is
 * still open here besides the asker's); -EPERM: another uid's token. why
 * says it either way.
 */
int seqs_resolve(struct seqs *s, uint64_t token, uint32_t uid, uint64_t seq, bool other_instance,
		 bool asker_has_token, struct rec_seq *ret, char *why, size_t why_len);

/* Tokens and results remembered now. */
size_t seqs_tokens(const struct seqs *s);
size_t seqs_results(const struct seqs *s);

#endif
