/*
 * daemon/remote/peer_auth.c: the daemons' challenge-response and the secret file.
 *
 * - Two sides with one secret agree, and derive the same session key.
 * - The proofs are the documented HMAC (computed here independently from
 *   peer_auth.h's description), so the wire format cannot drift unseen.
 * - Refused: a wrong secret, a proof replayed from an earlier exchange, a
 *   side's own proof reflected back to it, a peer using this node's name,
 *   truncated or over-long proofs and nonces, bad names, steps out of order.
 * - The secret file: refused when group or others may use it, when it is
 *   a symbolic link, not a regular file, another user's, too short or too
 *   long; each message names the file and the reason.
 */
#include <errno.h>
#include <fcntl.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>

#include "daemon/remote/peer_auth.h"

static const uint8_t secret[] = "0123456789abcdef0123456789abcdef-the-shared-one";
static const uint8_t other_secret[] = "0123456789abcdef0123456789abcdef-the-shared-onf";
#define SECRET_LEN (sizeof(secret) - 1)

static char dir[64];

/* Both Hellos exchanged: d dialled l. */
static void hello(struct peer_auth *d, const char *dname, const uint8_t *dsecret,
		  struct peer_auth *l, const char *lname, const uint8_t *lsecret)
{
	assert_int_equal(peer_auth_init(d, PEER_AUTH_DIALLER, dname, dsecret, SECRET_LEN), 0);
	assert_int_equal(peer_auth_init(l, PEER_AUTH_LISTENER, lname, lsecret, SECRET_LEN), 0);
	assert_int_equal(peer_auth_set_peer(l, dname, strlen(dname), peer_auth_nonce(d),
					    PEER_AUTH_NONCE_LEN),
			 0);
	assert_int_equal(peer_auth_set_peer(d, lname, strlen(lname), peer_auth_nonce(l),
					    PEER_AUTH_NONCE_LEN),
			 0);
}

static void test_same_secret_agrees(void **state)
{
	struct peer_auth d, l;
	uint8_t pl[PEER_AUTH_MAC_LEN], pd[PEER_AUTH_MAC_LEN];
	uint8_t kd[PEER_AUTH_MAC_LEN], kl[PEER_AUTH_MAC_LEN], zero[PEER_AUTH_MAC_LEN] = { 0 };

	hello(&d, "node-a", secret, &l, "node-b", secret);
	assert_memory_not_equal(peer_auth_nonce(&d), peer_auth_nonce(&l), PEER_AUTH_NONCE_LEN);
	assert_int_equal(peer_auth_prove(&l, pl), 0);
	assert_int_equal(peer_auth_verify(&d, pl, sizeof(pl)), 0);
	assert_int_equal(peer_auth_prove(&d, pd), 0);
	assert_int_equal(peer_auth_verify(&l, pd, sizeof(pd)), 0);
	/* The two directions' proofs differ: each has its own label. */
	assert_memory_not_equal(pl, pd, PEER_AUTH_MAC_LEN);
	assert_int_equal(peer_auth_session_key(&d, kd), 0);
	assert_int_equal(peer_auth_session_key(&l, kl), 0);
	assert_memory_equal(kd, kl, PEER_AUTH_MAC_LEN);
	assert_memory_not_equal(kd, zero, PEER_AUTH_MAC_LEN);
	assert_memory_not_equal(kd, pl, PEER_AUTH_MAC_LEN);
	peer_auth_fini(&d);
	peer_auth_fini(&l);
	/* fini wipes the secret. */
	assert_int_equal(d.secret_len, 0);
	assert_int_equal(d.secret[0], 0);
	peer_auth_fini(NULL);
}

/*
 * A rotation: a side that also accepts the other secret lets the other's
 * proof pass, and still proves with its first one; a side without it
 * refuses. Then the split of a secret file into its lines.
 */
static void test_rotation_accepts_the_second_secret(void **state)
{
	struct peer_auth d, l;
	uint8_t pl[PEER_AUTH_MAC_LEN], pd[PEER_AUTH_MAC_LEN];

	(void)state;
	/* d proves with the old secret and accepts the new; l has the new one alone. */
	hello(&d, "node-a", other_secret, &l, "node-b", secret);
	assert_int_equal(peer_auth_also_accept(&d, secret, SECRET_LEN), 0);
	assert_int_equal(peer_auth_prove(&l, pl), 0);
	assert_int_equal(peer_auth_verify(&d, pl, sizeof(pl)), 0); /* the second passed */
	assert_int_equal(peer_auth_prove(&d, pd), 0);
	assert_int_equal(peer_auth_verify(&l, pd, sizeof(pd)), -EACCES); /* old: l lacks it */
	peer_auth_fini(&d);
	peer_auth_fini(&l);
	/* Once l accepts the old one too, both pass. */
	hello(&d, "node-a", other_secret, &l, "node-b", secret);
	assert_int_equal(peer_auth_also_accept(&d, secret, SECRET_LEN), 0);
	assert_int_equal(peer_auth_also_accept(&l, other_secret, SECRET_LEN), 0);
	assert_int_equal(peer_auth_prove(&l, pl), 0);
	assert_int_equal(peer_auth_verify(&d, pl, sizeof(pl)), 0);
	assert_int_equal(peer_auth_prove(&d, pd), 0);
	assert_int_equal(peer_auth_verify(&l, pd, sizeof(pd)), 0);
	assert_int_equal(peer_auth_also_accept(&l, secret, PEER_SECRET_MIN - 1), -EINVAL);
	peer_auth_fini(&d);
	peer_auth_fini(&l);
}

static void test_secret_file_lines(void **state)
{
	uint8_t buf[PEER_SECRET_MAX], bin[PEER_SECRET_MIN + 2];
	const uint8_t *second;
	size_t first, second_len;
	char why[300];
	const char *two = "  0123456789abcdef0123456789abcdef-new \r\n\n"
			  "0123456789abcdef0123456789abcdef-old\n";
	const char *three = "0123456789abcdef0123456789abcdef-1\n"
			    "0123456789abcdef0123456789abcdef-2\n"
			    "0123456789abcdef0123456789abcdef-3\n";
	const char *short2 = "0123456789abcdef0123456789abcdef-1\nshort\n";

	(void)state;
	memcpy(buf, two, strlen(two));
	assert_int_equal(peer_secret_split("f", buf, strlen(two), &first, &second, &second_len, why,
					   sizeof(why)),
			 0);
	assert_int_equal(first, 36);
	assert_memory_equal(buf, "0123456789abcdef0123456789abcdef-new", 36);
	assert_int_equal(second_len, 36);
	assert_memory_equal(second, "0123456789abcdef0123456789abcdef-old", 36);
	memcpy(buf, three, strlen(three));
	assert_int_equal(peer_secret_split("f", buf, strlen(three), &first, &second, &second_len,
					   why, sizeof(why)),
			 -EINVAL);
	assert_non_null(strstr(why, "more than two secrets"));
	assert_non_null(strstr(why, "peer secret file f"));
	memcpy(buf, short2, strlen(short2));
	assert_int_equal(peer_secret_split("f", buf, strlen(short2), &first, &second, &second_len,
					   why, sizeof(why)),
			 -EINVAL);
	assert_non_null(strstr(why, "line 2: 5 bytes"));
	/* A binary secret, newlines and all, stays one secret. */
	memset(bin, 0xa5, sizeof(bin));
	bin[5] = '\n';
	memcpy(buf, bin, sizeof(bin));
	assert_int_equal(peer_secret_split("f", buf, sizeof(bin), &first, &second, &second_len, why,
					   sizeof(why)),
			 0);
	assert_int_equal(first, sizeof(bin));
	assert_int_equal(second_len, 0);
	assert_null(second);
}

/* The proof as peer_auth.h documents it, computed here from the description. */
static void documented_proof(const char *label, const uint8_t *key, const char *name_d,
			     const char *name_l, const uint8_t *nonce_d, const uint8_t *nonce_l,
			     uint8_t out[PEER_AUTH_MAC_LEN])
{
	uint8_t t[512];
	size_t n = 0;
	unsigned int len = 0;

	memcpy(t, label, strlen(label) + 1);
	n += strlen(label) + 1;
	t[n++] = (uint8_t)strlen(name_d);
	memcpy(t + n, name_d, strlen(name_d));
	n += strlen(name_d);
	t[n++] = (uint8_t)strlen(name_l);
	memcpy(t + n, name_l, strlen(name_l));
	n += strlen(name_l);
	memcpy(t + n, nonce_d, PEER_AUTH_NONCE_LEN);
	n += PEER_AUTH_NONCE_LEN;
	memcpy(t + n, nonce_l, PEER_AUTH_NONCE_LEN);
	n += PEER_AUTH_NONCE_LEN;
	assert_non_null(HMAC(EVP_sha256(), key, (int)SECRET_LEN, t, n, out, &len));
	assert_int_equal(len, PEER_AUTH_MAC_LEN);
}

static void test_proofs_are_the_documented_hmac(void **state)
{
	struct peer_auth d, l;
	uint8_t got[PEER_AUTH_MAC_LEN], want[PEER_AUTH_MAC_LEN];

	hello(&d, "node-a", secret, &l, "node-b", secret);
	assert_int_equal(peer_auth_prove(&l, got), 0);
	documented_proof("tensord-peer-v1 listener", secret, "node-a", "node-b",
			 peer_auth_nonce(&d), peer_auth_nonce(&l), want);
	assert_memory_equal(got, want, PEER_AUTH_MAC_LEN);

	/* A dialler's proof made by the description is accepted by the listener... */
	documented_proof("tensord-peer-v1 dialler", secret, "node-a", "node-b", peer_auth_nonce(&d),
			 peer_auth_nonce(&l), want);
	assert_int_equal(peer_auth_verify(&l, want, sizeof(want)), 0);
	peer_auth_fini(&l);

	/* ...and the same made with another secret is not. */
	hello(&d, "node-a", secret, &l, "node-b", secret);
	documented_proof("tensord-peer-v1 dialler", other_secret, "node-a", "node-b",
			 peer_auth_nonce(&d), peer_auth_nonce(&l), want);
	assert_int_equal(peer_auth_verify(&l, want, sizeof(want)), -EACCES);
	assert_int_equal(peer_auth_session_key(&l, got), -EPERM);
	peer_auth_fini(&d);
	peer_auth_fini(&l);
}

static void test_wrong_secret_refused(void **state)
{
	struct peer_auth d, l;
	uint8_t p[PEER_AUTH_MAC_LEN], k[PEER_AUTH_MAC_LEN];

	/* The listener has the wrong secret: the dialler refuses it, and then proves nothing. */
	hello(&d, "node-a", secret, &l, "node-b", other_secret);
	assert_int_equal(peer_auth_prove(&l, p), 0);
	assert_int_equal(peer_auth_verify(&d, p, sizeof(p)), -EACCES);
	assert_int_equal(peer_auth_prove(&d, p), -EPROTO);
	assert_int_equal(peer_auth_session_key(&d, k), -EPERM);
	peer_auth_fini(&d);
	peer_auth_fini(&l);
}

static void test_replayed_proof_refused(void **state)
{
	struct peer_auth d, l;
	uint8_t old_pd[PEER_AUTH_MAC_LEN], old_pl[PEER_AUTH_MAC_LEN], pl[PEER_AUTH_MAC_LEN];
	uint8_t old_nd[PEER_AUTH_NONCE_LEN], old_nl[PEER_AUTH_NONCE_LEN];

	/* An exchange an attacker recorded: both nonces and both proofs. */
	hello(&d, "node-a", secret, &l, "node-b", secret);
	memcpy(old_nd, peer_auth_nonce(&d), sizeof(old_nd));
	memcpy(old_nl, peer_auth_nonce(&l), sizeof(old_nl));
	assert_int_equal(peer_auth_prove(&l, old_pl), 0);
	assert_int_equal(peer_auth_verify(&d, old_pl, sizeof(old_pl)), 0);
	assert_int_equal(peer_auth_prove(&d, old_pd), 0);
	peer_auth_fini(&d);
	peer_auth_fini(&l);

	/*
	 * Played again, the attacker repeating the recorded side's nonce as
	 * well: to a fresh listener as the dialler, and to a fresh dialler as
	 * the listener. The fresh side's own nonce refuses each.
	 */
	assert_int_equal(peer_auth_init(&l, PEER_AUTH_LISTENER, "node-b", secret, SECRET_LEN), 0);
	assert_int_equal(peer_auth_set_peer(&l, "node-a", 6, old_nd, sizeof(old_nd)), 0);
	assert_int_equal(peer_auth_verify(&l, old_pd, sizeof(old_pd)), -EACCES);
	peer_auth_fini(&l);
	assert_int_equal(peer_auth_init(&d, PEER_AUTH_DIALLER, "node-a", secret, SECRET_LEN), 0);
	assert_int_equal(peer_auth_set_peer(&d, "node-b", 6, old_nl, sizeof(old_nl)), 0);
	assert_int_equal(peer_auth_verify(&d, old_pl, sizeof(old_pl)), -EACCES);
	peer_auth_fini(&d);

	/* The honest proofs of a new exchange still pass: the refusals were the replays'. */
	hello(&d, "node-a", secret, &l, "node-b", secret);
	assert_int_equal(peer_auth_prove(&l, pl), 0);
	assert_int_equal(peer_auth_verify(&d, pl, sizeof(pl)), 0);
	peer_auth_fini(&d);
	peer_auth_fini(&l);
}

static void test_reflected_proof_refused(void **state)
{
	struct peer_auth d, l, l2;
	uint8_t pl[PEER_AUTH_MAC_LEN];

	/* The listener's own proof sent back to it as the dialler's. */
	hello(&d, "node-a", secret, &l, "node-b", secret);
	assert_int_equal(peer_auth_prove(&l, pl), 0);
	assert_int_equal(peer_auth_verify(&l, pl, sizeof(pl)), -EACCES);
	peer_auth_fini(&d);
	peer_auth_fini(&l);

	/*
	 * A peer that claims this node's own name: refused before any proof,
	 * since two connections of one node (one accepted, one dialled) would
	 * otherwise share a transcript an attacker could relay between them.
	 */
	assert_int_equal(peer_auth_init(&l2, PEER_AUTH_LISTENER, "node-b", secret, SECRET_LEN), 0);
	assert_int_equal(
		peer_auth_set_peer(&l2, "node-b", 6, peer_auth_nonce(&l2), PEER_AUTH_NONCE_LEN),
		-ELOOP);
	assert_int_equal(peer_auth_prove(&l2, pl), -EPROTO);
	peer_auth_fini(&l2);
}

static void test_proof_for_other_names_refused(void **state)
{
	struct peer_auth d, l;
	uint8_t want[PEER_AUTH_MAC_LEN];

	/* A correct proof, but made for node-c dialling node-b. */
	hello(&d, "node-a", secret, &l, "node-b", secret);
	documented_proof("tensord-peer-v1 dialler", secret, "node-c", "node-b", peer_auth_nonce(&d),
			 peer_auth_nonce(&l), want);
	assert_int_equal(peer_auth_verify(&l, want, sizeof(want)), -EACCES);
	peer_auth_fini(&d);
	peer_auth_fini(&l);
}

static void test_truncated_input_refused(void **state)
{
	struct peer_auth d, l;
	uint8_t pl[PEER_AUTH_MAC_LEN + 1], k[PEER_AUTH_MAC_LEN];
	uint8_t nonce[PEER_AUTH_NONCE_LEN + 1] = { 0 };
	char long_name[PEER_NAME_MAX + 2];

	assert_int_equal(peer_auth_init(&l, PEER_AUTH_LISTENER, "node-b", secret, SECRET_LEN), 0);
	/* Nonces of the wrong length, bad names. */
	assert_int_equal(peer_auth_set_peer(&l, "node-a", 6, nonce, PEER_AUTH_NONCE_LEN - 1),
			 -EPROTO);
	assert_int_equal(peer_auth_set_peer(&l, "node-a", 6, nonce, PEER_AUTH_NONCE_LEN + 1),
			 -EPROTO);
	assert_int_equal(peer_auth_set_peer(&l, "", 0, nonce, PEER_AUTH_NONCE_LEN), -EINVAL);
	assert_int_equal(peer_auth_set_peer(&l, "node a", 6, nonce, PEER_AUTH_NONCE_LEN), -EINVAL);
	assert_int_equal(peer_auth_set_peer(&l, "node\0a", 6, nonce, PEER_AUTH_NONCE_LEN), -EINVAL);
	assert_int_equal(peer_auth_set_peer(&l, "node-a/x", 8, nonce, PEER_AUTH_NONCE_LEN),
			 -EINVAL);
	memset(long_name, 'n', sizeof(long_name));
	assert_int_equal(
		peer_auth_set_peer(&l, long_name, PEER_NAME_MAX + 1, nonce, PEER_AUTH_NONCE_LEN),
		-EINVAL);
	assert_true(peer_name_valid(long_name, PEER_NAME_MAX));
	/* Nothing was taken by the refusals: an honest Hello still goes through. */
	assert_int_equal(peer_auth_init(&d, PEER_AUTH_DIALLER, "node-a", secret, SECRET_LEN), 0);
	assert_int_equal(
		peer_auth_set_peer(&l, "node-a", 6, peer_auth_nonce(&d), PEER_AUTH_NONCE_LEN), 0);
	/* ...once only. */
	assert_int_equal(
		peer_auth_set_peer(&l, "node-a", 6, peer_auth_nonce(&d), PEER_AUTH_NONCE_LEN),
		-EPROTO);
	assert_int_equal(
		peer_auth_set_peer(&d, "node-b", 6, peer_auth_nonce(&l), PEER_AUTH_NONCE_LEN), 0);
	/* A proof cut short, or with a byte more, is refused for its length. */
	assert_int_equal(peer_auth_prove(&l, pl), 0);
	assert_int_equal(peer_auth_verify(&d, pl, PEER_AUTH_MAC_LEN - 1), -EPROTO);
	assert_int_equal(peer_auth_verify(&d, pl, 0), -EPROTO);
	pl[PEER_AUTH_MAC_LEN] = 0;
	assert_int_equal(peer_auth_verify(&d, pl, PEER_AUTH_MAC_LEN + 1), -EPROTO);
	assert_int_equal(peer_auth_session_key(&d, k), -EPERM);
	/* One flipped bit. */
	pl[PEER_AUTH_MAC_LEN - 1] ^= 1;
	assert_int_equal(peer_auth_verify(&d, pl, PEER_AUTH_MAC_LEN), -EACCES);
	pl[PEER_AUTH_MAC_LEN - 1] ^= 1;
	assert_int_equal(peer_auth_verify(&d, pl, PEER_AUTH_MAC_LEN), 0);
	peer_auth_fini(&d);
	peer_auth_fini(&l);
}

static void test_steps_out_of_order(void **state)
{
	struct peer_auth d;
	uint8_t p[PEER_AUTH_MAC_LEN];

	/* Secrets too short or too long, bad own names. */
	assert_int_equal(
		peer_auth_init(&d, PEER_AUTH_DIALLER, "node-a", secret, PEER_SECRET_MIN - 1),
		-EINVAL);
	assert_int_equal(
		peer_auth_init(&d, PEER_AUTH_DIALLER, "node-a", secret, PEER_SECRET_MAX + 1),
		-EINVAL);
	assert_int_equal(peer_auth_init(&d, PEER_AUTH_DIALLER, "", secret, SECRET_LEN), -EINVAL);
	/* Nothing before the other side's Hello. */
	assert_int_equal(peer_auth_init(&d, PEER_AUTH_DIALLER, "node-a", secret, SECRET_LEN), 0);
	assert_int_equal(peer_auth_prove(&d, p), -EPROTO);
	memset(p, 0, sizeof(p));
	assert_int_equal(peer_auth_verify(&d, p, sizeof(p)), -EPROTO);
	assert_int_equal(peer_auth_session_key(&d, p), -EPERM);
	peer_auth_fini(&d);
}

/* --- the secret file ------------------------------------------------------ */

static char err[512];

static void write_file(const char *p, const char *text, size_t n, mode_t mode)
{
	int fd;

	unlink(p);
	fd = open(p, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
	assert_true(fd >= 0);
	assert_int_equal(write(fd, text, n), (ssize_t)n);
	assert_int_equal(fchmod(fd, mode), 0);
	close(fd);
}

static int load(const char *p, size_t *len, uint8_t *buf)
{
	return peer_secret_load(p, buf, PEER_SECRET_MAX, len, err, sizeof(err));
}

static void test_secret_file_good(void **state)
{
	char p[128];
	uint8_t buf[PEER_SECRET_MAX];
	size_t len = 0;

	snprintf(p, sizeof(p), "%s/good", dir);
	write_file(p, "0123456789abcdef0123456789abcdef xyz \r\n\n", 40, 0600);
	assert_int_equal(load(p, &len, buf), 0);
	/* Trailing blanks and newlines are not the secret; the inner blank is. */
	assert_int_equal(len, 36);
	assert_memory_equal(buf, "0123456789abcdef0123456789abcdef xyz", 36);
	assert_string_equal(err, "");
	/* 0400 is as good. */
	assert_int_equal(chmod(p, 0400), 0);
	assert_int_equal(load(p, &len, buf), 0);
}

static void test_secret_file_mode_refused(void **state)
{
	static const mode_t bad[] = { 0640, 0604, 0644, 0620, 0602, 0610, 0660 };
	char p[128];
	uint8_t buf[PEER_SECRET_MAX];
	size_t len = 0;

	snprintf(p, sizeof(p), "%s/wide", dir);
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		char want[32];

		write_file(p, "0123456789abcdef0123456789abcdef", 32, bad[i]);
		assert_int_equal(load(p, &len, buf), -EPERM);
		snprintf(want, sizeof(want), "mode %04o", (unsigned)bad[i]);
		assert_non_null(strstr(err, p));
		assert_non_null(strstr(err, want));
		assert_non_null(strstr(err, "chmod 600"));
		assert_non_null(strstr(err, (bad[i] & 044) ? "may read" : "may write or execute"));
	}
}

static void test_secret_file_kinds_refused(void **state)
{
	char p[128], target[128];
	uint8_t buf[PEER_SECRET_MAX];
	size_t len = 0;

	/* A symbolic link, even to a good file. */
	snprintf(target, sizeof(target), "%s/target", dir);
	write_file(target, "0123456789abcdef0123456789abcdef", 32, 0600);
	snprintf(p, sizeof(p), "%s/link", dir);
	assert_int_equal(symlink(target, p), 0);
	assert_int_equal(load(p, &len, buf), -ELOOP);
	assert_non_null(strstr(err, p));
	assert_non_null(strstr(err, "symbolic link"));

	/* A directory; a FIFO (opened without blocking, refused by type). */
	assert_int_equal(load(dir, &len, buf), -EINVAL);
	assert_non_null(strstr(err, "not a regular file"));
	snprintf(p, sizeof(p), "%s/fifo", dir);
	assert_int_equal(mkfifo(p, 0600), 0);
	assert_int_equal(load(p, &len, buf), -EINVAL);
	assert_non_null(strstr(err, "not a regular file"));

	/* Missing. */
	snprintf(p, sizeof(p), "%s/none", dir);
	assert_int_equal(load(p, &len, buf), -ENOENT);
	assert_non_null(strstr(err, p));
	assert_non_null(strstr(err, "No such file"));
}

static void test_secret_file_size_refused(void **state)
{
	char p[128], big[PEER_SECRET_MAX + 2];
	uint8_t buf[PEER_SECRET_MAX];
	size_t len = 0;

	snprintf(p, sizeof(p), "%s/size", dir);
	/* 31 bytes, and 32 that are only 31 once the newline goes. */
	write_file(p, "0123456789abcdef0123456789abcde", 31, 0600);
	assert_int_equal(load(p, &len, buf), -EINVAL);
	assert_non_null(strstr(err, "31 bytes of secret, fewer than 32"));
	write_file(p, "0123456789abcdef0123456789abcde\n", 32, 0600);
	assert_int_equal(load(p, &len, buf), -EINVAL);
	write_file(p, "", 0, 0600);
	assert_int_equal(load(p, &len, buf), -EINVAL);
	/* PEER_SECRET_MAX bytes pass, one more does not. */
	memset(big, 'k', sizeof(big));
	write_file(p, big, PEER_SECRET_MAX, 0600);
	assert_int_equal(load(p, &len, buf), 0);
	assert_int_equal(len, PEER_SECRET_MAX);
	write_file(p, big, PEER_SECRET_MAX + 1, 0600);
	assert_int_equal(load(p, &len, buf), -EINVAL);
	assert_non_null(strstr(err, "longer than 4096 bytes"));
}

static void test_secret_file_owner_refused(void **state)
{
	char p[128];
	uint8_t buf[PEER_SECRET_MAX];
	size_t len = 0;

	snprintf(p, sizeof(p), "%s/theirs", dir);
	write_file(p, "0123456789abcdef0123456789abcdef", 32, 0600);
	if (chown(p, 4242, (gid_t)-1) < 0)
		skip(); /* only root can give a file away */
	assert_int_equal(load(p, &len, buf), -EPERM);
	assert_non_null(strstr(err, "owned by uid 4242"));
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_same_secret_agrees),
		cmocka_unit_test(test_proofs_are_the_documented_hmac),
		cmocka_unit_test(test_wrong_secret_refused),
		cmocka_unit_test(test_replayed_proof_refused),
		cmocka_unit_test(test_reflected_proof_refused),
		cmocka_unit_test(test_proof_for_other_names_refused),
		cmocka_unit_test(test_truncated_input_refused),
		cmocka_unit_test(test_steps_out_of_order),
		cmocka_unit_test(test_secret_file_good),
		cmocka_unit_test(test_secret_file_mode_refused),
		cmocka_unit_test(test_secret_file_kinds_refused),
		cmocka_unit_test(test_secret_file_size_refused),
		cmocka_unit_test(test_secret_file_owner_refused),
		cmocka_unit_test(test_rotation_accepts_the_second_secret),
		cmocka_unit_test(test_secret_file_lines),
	};
	char cmd[128];
	int r;

	snprintf(dir, sizeof(dir), "/tmp/tensord-peer-auth-%d", (int)getpid());
	assert_int_equal(mkdir(dir, 0700), 0);
	r = cmocka_run_group_tests(tests, NULL, NULL);
	snprintf(cmd, sizeof(cmd), "rm -rf %s", dir);
	return system(cmd) == 0 ? r : 1;
}
