/* What clients' effecting requests did, per token (seqs.h). */
#include "seqs.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/queue.h>

#include <uv/tree.h>

struct seq_token {
	RB_ENTRY(seq_token) link;
	TAILQ_ENTRY(seq_token) age; /* least recently used first */
	uint64_t token;
	uint32_t uid;
	uint32_t conns; /* connections open with it */
	/*
	 * The lowest seq whose fate is known: every result from it on that
	 * took effect is in ring[]. 0 for a token seen from its first request;
	 * past a result evicted; UINT64_MAX for a token (re)made after the
	 * table evicted tokens, until its first result.
	 */
	uint64_t known_from;
	unsigned n, head; /* ring[head] is the oldest of n */
	struct rec_seq ring[SEQS_PER_TOKEN];
};

static int cmp_tokens(const struct seq_token *a, const struct seq_token *b)
{
	return a->token < b->token ? -1 : a->token > b->token;
}

RB_HEAD(seq_tokens, seq_token);
RB_GENERATE_STATIC(seq_tokens, seq_token, link, cmp_tokens)

struct seqs {
	struct seq_tokens tokens;
	TAILQ_HEAD(, seq_token) age;
	size_t n_tokens, max_tokens, n_results;
	bool evicted; /* some token was evicted: an unknown token may have had results */
	struct rec_seq armed, stepped;
	bool is_armed, has_step;
};

struct seqs *seqs_new(size_t max_tokens)
{
	struct seqs *s = calloc(1, sizeof(*s));

	if (!s)
		return NULL;
	RB_INIT(&s->tokens);
	TAILQ_INIT(&s->age);
	s->max_tokens = max_tokens ? max_tokens : SEQS_TOKENS_MAX;
	return s;
}

static void token_drop(struct seqs *s, struct seq_token *t)
{
	RB_REMOVE(seq_tokens, &s->tokens, t);
	TAILQ_REMOVE(&s->age, t, age);
	s->n_tokens--;
	s->n_results -= t->n;
	free(t);
}

void seqs_free(struct seqs *s)
{
	struct seq_token *t, *tn;

	if (!s)
		return;
	RB_FOREACH_SAFE(t, seq_tokens, &s->tokens, tn)
	token_drop(s, t);
	free(s);
}

static struct seq_token *token_find(const struct seqs *s, uint64_t token)
{
	struct seq_token key = { .token = token };

	return RB_FIND(seq_tokens, (struct seq_tokens *)&s->tokens, &key);
}

static void touch(struct seqs *s, struct seq_token *t)
{
	TAILQ_REMOVE(&s->age, t, age);
	TAILQ_INSERT_TAIL(&s->age, t, age);
}

/* token's entry, made (the oldest idle one evicted past the bound) when new; NULL out of memory. */
static struct seq_token *token_get(struct seqs *s, uint64_t token, uint32_t uid)
{
	struct seq_token *t = token_find(s, token), *old;

	if (t) {
		touch(s, t);
		return t;
	}
	if (s->n_tokens >= s->max_tokens) {
		/* Tokens with a connection open are never evicted: there are at
		 * most as many of them as connections. */
		TAILQ_FOREACH(old, &s->age, age)
		if (!old->conns)
			break;
		if (old) {
			token_drop(s, old);
			s->evicted = true;
		}
	}
	t = calloc(1, sizeof(*t));
	if (!t)
		return NULL;
	t->token = token;
	t->uid = uid;
	t->known_from = s->evicted ? UINT64_MAX : 0;
	RB_INSERT(seq_tokens, &s->tokens, t);
	TAILQ_INSERT_TAIL(&s->age, t, age);
	s->n_tokens++;
	return t;
}

int seqs_open(struct seqs *s, uint64_t token, uint32_t uid)
{
	struct seq_token *t = token_find(s, token);

	if (t && t->uid != uid)
		return -EPERM;
	t = token_get(s, token, uid);
	if (!t)
		return -ENOMEM;
	t->conns++;
	return 0;
}

void seqs_close(struct seqs *s, uint64_t token)
{
	struct seq_token *t = token_find(s, token);

	if (t && t->conns)
		t->conns--;
}

void seqs_arm(struct seqs *s, uint64_t token, uint32_t uid, uint64_t seq, enum seq_kind kind)
{
	s->armed = (struct rec_seq){ .token = token, .seq = seq, .uid = uid, .kind = kind };
	s->is_armed = true;
	s->has_step = false;
}

void seqs_disarm(struct seqs *s)
{
	s->is_armed = false;
	s->has_step = false;
}

bool seqs_armed(const struct seqs *s)
{
	return s && s->is_armed;
}

enum seq_kind seqs_armed_kind(const struct seqs *s)
{
	return s && s->is_armed ? (enum seq_kind)s->armed.kind : 0;
}

/* Remembers result e of its token (made as needed); the token's oldest goes past the bound. */
static void remember(struct seqs *s, const struct rec_seq *e)
{
	struct seq_token *t = token_get(s, e->token, e->uid);
	struct rec_seq *slot;

	if (!t) {
		/* Out of memory: nothing is known of unknown tokens from now. */
		s->evicted = true;
		return;
	}
	if (t->known_from == UINT64_MAX)
		t->known_from = e->seq;
	if (t->n == SEQS_PER_TOKEN) {
		/* The oldest goes; what is below the next one is not known now. */
		t->known_from = t->ring[t->head].seq + 1;
		t->head = (t->head + 1) % SEQS_PER_TOKEN;
		t->n--;
		s->n_results--;
	}
	slot = &t->ring[(t->head + t->n) % SEQS_PER_TOKEN];
	*slot = *e;
	t->n++;
	s->n_results++;
}

void seqs_step(struct seqs *s, const struct rec_seq *res)
{
	if (!s)
		return;
	if (!s->is_armed || !res) {
		s->has_step = false; /* a step no request made: nothing to log with it */
		return;
	}
	s->stepped = *res;
	s->stepped.token = s->armed.token;
	s->stepped.seq = s->armed.seq;
	s->stepped.uid = s->armed.uid;
	s->stepped.kind = s->armed.kind;
	remember(s, &s->stepped);
	s->is_armed = false;
	s->has_step = true;
}

const struct rec_seq *seqs_take_step(struct seqs *s)
{
	if (!s || !s->has_step)
		return NULL;
	s->has_step = false;
	return &s->stepped;
}

void seqs_restore(struct seqs *s, const struct rec_seq *e)
{
	struct seq_token *t;

	switch (e->kind) {
	case SEQ_EVICTED:
		s->evicted = true;
		return;
	case SEQ_FLOOR:
		t = e->token ? token_get(s, e->token, e->uid) : NULL;
		if (t && (t->known_from < e->seq || t->known_from == UINT64_MAX))
			t->known_from = e->seq;
		return;
	case SEQ_PUBLISHED:
	case SEQ_COMMITTED:
	case SEQ_UNLINKED:
		if (e->token && e->seq)
			remember(s, e);
		return;
	default:
		return; /* of no known kind: not a result */
	}
}

void seqs_forget_all(struct seqs *s)
{
	struct seq_token *t, *tn;

	RB_FOREACH_SAFE(t, seq_tokens, &s->tokens, tn)
	token_drop(s, t);
	s->evicted = true;
}

void seqs_each(const struct seqs *s, void (*fn)(void *arg, const struct rec_seq *e), void *arg)
{
	struct seq_token *t;

	if (s->evicted)
		fn(arg, &(struct rec_seq){ .kind = SEQ_EVICTED });
	/* Least recently used first: restored in this order, the same ones go first. */
	TAILQ_FOREACH(t, &s->age, age)
	{
		/* Always, 0 too: restored into a table that evicted, a token
		 * with no floor would know nothing of its past. */
		fn(arg, &(struct rec_seq){ .token = t->token,
					   .seq = t->known_from,
					   .uid = t->uid,
					   .kind = SEQ_FLOOR });
		for (unsigned i = 0; i < t->n; i++)
			fn(arg, &t->ring[(t->head + i) % SEQS_PER_TOKEN]);
	}
}

int seqs_resolve(struct seqs *s, uint64_t token, uint32_t uid, uint64_t seq, bool other_instance,
		 bool asker_has_token, struct rec_seq *ret, char *why, size_t why_len)
{
	struct seq_token *t = token_find(s, token);
	uint32_t others;

	if (t && t->uid != uid) {
		snprintf(why, why_len, "resolve: token %016" PRIx64 " is another user's", token);
		return -EPERM;
	}
	if (t) {
		for (unsigned i = 0; i < t->n; i++) {
			const struct rec_seq *e = &t->ring[(t->head + i) % SEQS_PER_TOKEN];

			if (e->seq == seq) {
				*ret = *e;
				snprintf(why, why_len, "request %" PRIu64 " took effect", seq);
				return 1;
			}
		}
	}
	if (t ? seq < t->known_from : s->evicted) {
		snprintf(why, why_len,
			 "resolve: request %" PRIu64 " of token %016" PRIx64
			 ": this daemon remembers too few of its requests to know whether it "
			 "took effect (at most %u per token, %zu tokens)",
			 seq, token, SEQS_PER_TOKEN, s->max_tokens);
		return -ESTALE;
	}
	others = t ? t->conns - (asker_has_token && t->conns ? 1 : 0) : 0;
	if (!other_instance && others) {
		snprintf(why, why_len,
			 "resolve: request %" PRIu64 " of token %016" PRIx64
			 ": a connection of it is still open here, so it may yet take effect; "
			 "ask again once it is closed",
			 seq, token);
		return -ESTALE;
	}
	snprintf(why, why_len, "request %" PRIu64 " did not take effect", seq);
	return 0;
}

size_t seqs_tokens(const struct seqs *s)
{
	return s->n_tokens;
}

size_t seqs_results(const struct seqs *s)
{
	return s->n_results;
}
