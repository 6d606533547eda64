/*
 * Peer authentication: the HMAC-SHA256 challenge-response of peer_auth.h
 * and the shared secret's file. Everything here is a computation over
 * bytes the caller hands in; the only system calls are the secret file's
 * and the random source's.
 */
#include "peer_auth.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>

static const char label_dialler[] = "tensord-peer-v1 dialler";
static const char label_listener[] = "tensord-peer-v1 listener";
static const char label_session[] = "tensord-peer-v1 session";

/* The longest label, two length-prefixed names and two nonces. */
#define TRANSCRIPT_MAX (sizeof(label_listener) + 2 * (1 + PEER_NAME_MAX) + 2 * PEER_AUTH_NONCE_LEN)

bool peer_name_valid(const char *name, size_t len)
{
	if (len == 0 || len > PEER_NAME_MAX)
		return false;
	for (size_t i = 0; i < len; i++) {
		char c = name[i];

		if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
		      c == '.' || c == '_' || c == '-'))
			return false;
	}
	return true;
}

int peer_auth_init(struct peer_auth *a, enum peer_auth_role role, const char *self_name,
		   const uint8_t *secret, size_t secret_len)
{
	size_t n = strnlen(self_name, PEER_NAME_MAX + 1);

	memset(a, 0, sizeof(*a));
	a->role = role;
	if (!peer_name_valid(self_name, n) || secret_len < PEER_SECRET_MIN ||
	    secret_len > PEER_SECRET_MAX)
		return -EINVAL;
	memcpy(a->self, self_name, n);
	memcpy(a->secret, secret, secret_len);
	a->secret_len = secret_len;
	if (RAND_bytes(a->nonce_self, sizeof(a->nonce_self)) != 1) {
		peer_auth_fini(a);
		return -EIO;
	}
	return 0;
}

int peer_auth_also_accept(struct peer_auth *a, const uint8_t *secret, size_t secret_len)
{
	if (secret_len < PEER_SECRET_MIN || secret_len > PEER_SECRET_MAX)
		return -EINVAL;
	memcpy(a->also, secret, secret_len);
	a->also_len = secret_len;
	return 0;
}

const uint8_t *peer_auth_nonce(const struct peer_auth *a)
{
	return a->nonce_self;
}

int peer_auth_set_peer(struct peer_auth *a, const char *name, size_t name_len, const uint8_t *nonce,
		       size_t nonce_len)
{
	if (a->have_other || nonce_len != PEER_AUTH_NONCE_LEN)
		return -EPROTO;
	if (!peer_name_valid(name, name_len))
		return -EINVAL;
	if (name_len == strlen(a->self) && memcmp(name, a->self, name_len) == 0)
		return -ELOOP;
	memcpy(a->other, name, name_len);
	a->other[name_len] = '\0';
	memcpy(a->nonce_other, nonce, PEER_AUTH_NONCE_LEN);
	a->have_other = true;
	return 0;
}

static size_t put_name(uint8_t *p, const char *name)
{
	size_t n = strlen(name);

	p[0] = (uint8_t)n;
	memcpy(p + 1, name, n);
	return 1 + n;
}

/*
 * HMAC(secret, label || transcript) into out. Both sides lay the transcript
 * out by role (dialler first), not by self and other, so they compute the
 * same bytes.
 */
static int mac_with(const struct peer_auth *a, const uint8_t *key, size_t key_len,
		    const char *label, uint8_t out[PEER_AUTH_MAC_LEN])
{
	bool dialler = a->role == PEER_AUTH_DIALLER;
	const char *name_d = dialler ? a->self : a->other;
	const char *name_l = dialler ? a->other : a->self;
	const uint8_t *nonce_d = dialler ? a->nonce_self : a->nonce_other;
	const uint8_t *nonce_l = dialler ? a->nonce_other : a->nonce_self;
	uint8_t t[TRANSCRIPT_MAX];
	size_t n = strlen(label) + 1; /* with its NUL: no label is a prefix of another */
	unsigned int out_len = 0;

	memcpy(t, label, n);
	n += put_name(t + n, name_d);
	n += put_name(t + n, name_l);
	memcpy(t + n, nonce_d, PEER_AUTH_NONCE_LEN);
	n += PEER_AUTH_NONCE_LEN;
	memcpy(t + n, nonce_l, PEER_AUTH_NONCE_LEN);
	n += PEER_AUTH_NONCE_LEN;
	if (!HMAC(EVP_sha256(), key, (int)key_len, t, n, out, &out_len) ||
	    out_len != PEER_AUTH_MAC_LEN)
		return -EIO;
	return 0;
}

static int mac(const struct peer_auth *a, const char *label, uint8_t out[PEER_AUTH_MAC_LEN])
{
	return mac_with(a, a->secret, a->secret_len, label, out);
}

int peer_auth_prove(const struct peer_auth *a, uint8_t out[PEER_AUTH_MAC_LEN])
{
	if (!a->have_other || (a->role == PEER_AUTH_DIALLER && !a->verified))
		return -EPROTO;
	return mac(a, a->role == PEER_AUTH_DIALLER ? label_dialler : label_listener, out);
}

int peer_auth_verify(struct peer_auth *a, const uint8_t *proof, size_t len)
{
	uint8_t want[PEER_AUTH_MAC_LEN];
	const char *label;
	int r;

	if (!a->have_other || len != PEER_AUTH_MAC_LEN)
		return -EPROTO;
	/* The other side's proof carries the other side's label. */
	label = a->role == PEER_AUTH_DIALLER ? label_listener : label_dialler;
	r = mac(a, label, want);
	if (r < 0)
		return r;
	r = CRYPTO_memcmp(want, proof, PEER_AUTH_MAC_LEN) == 0 ? 0 : -EACCES;
	if (r == -EACCES && a->also_len) { /* a rotation under way: the other secret */
		r = mac_with(a, a->also, a->also_len, label, want);
		if (r == 0)
			r = CRYPTO_memcmp(want, proof, PEER_AUTH_MAC_LEN) == 0 ? 0 : -EACCES;
	}
	OPENSSL_cleanse(want, sizeof(want));
	a->verified = r == 0;
	return r;
}

int peer_auth_session_key(const struct peer_auth *a, uint8_t out[PEER_AUTH_MAC_LEN])
{
	if (!a->verified)
		return -EPERM;
	return mac(a, label_session, out);
}

void peer_auth_fini(struct peer_auth *a)
{
	if (a)
		OPENSSL_cleanse(a, sizeof(*a));
}

static int fail(int r, char *err, size_t errlen, const char *path, const char *fmt, ...)
	__attribute__((format(printf, 5, 6)));

static int fail(int r, char *err, size_t errlen, const char *path, const char *fmt, ...)
{
	va_list ap;
	int n = snprintf(err, errlen, "peer secret file %s: ", path);

	if (n >= 0 && (size_t)n < errlen) {
		va_start(ap, fmt);
		vsnprintf(err + n, errlen - (size_t)n, fmt, ap);
		va_end(ap);
	}
	return r;
}

int peer_secret_load(const char *path, uint8_t *buf, size_t cap, size_t *ret_len, char *err,
		     size_t errlen)
{
	uint8_t tmp[PEER_SECRET_MAX + 1];
	struct stat st;
	size_t n = 0;
	int fd, r = 0;

	if (errlen > 0)
		err[0] = '\0';
	if (cap < PEER_SECRET_MAX)
		return fail(-EINVAL, err, errlen, path, "buffer of %zu bytes, need %d", cap,
			    PEER_SECRET_MAX);
	/* O_NONBLOCK: a FIFO put in its place must not hang the start. */
	fd = open(path, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_NOCTTY | O_CLOEXEC);
	if (fd < 0) {
		r = -errno;
		if (r == -ELOOP)
			return fail(r, err, errlen, path,
				    "it is a symbolic link; name the file itself");
		return fail(r, err, errlen, path, "cannot open it: %s", strerror(-r));
	}
	if (fstat(fd, &st) < 0) {
		r = -errno;
		fail(r, err, errlen, path, "cannot stat it: %s", strerror(-r));
		goto out;
	}
	if (!S_ISREG(st.st_mode)) {
		r = fail(-EINVAL, err, errlen, path, "not a regular file");
		goto out;
	}
	if (st.st_uid != 0 && st.st_uid != geteuid()) {
		r = fail(-EPERM, err, errlen, path,
			 "owned by uid %u, not by root or this daemon's uid %u, who alone may "
			 "hold the secret",
			 (unsigned)st.st_uid, (unsigned)geteuid());
		goto out;
	}
	if (st.st_mode & 077) {
		r = fail(-EPERM, err, errlen, path,
			 "mode %04o: group or others may %s it; chmod 600 it",
			 (unsigned)(st.st_mode & 07777),
			 (st.st_mode & 044) ? "read" : "write or execute");
		goto out;
	}
	/* One byte more than the limit: a file that grew since fstat is seen. */
	while (n < sizeof(tmp)) {
		ssize_t got = read(fd, tmp + n, sizeof(tmp) - n);

		if (got < 0 && errno == EINTR)
			continue;
		if (got < 0) {
			r = -errno;
			fail(r, err, errlen, path, "cannot read it: %s", strerror(-r));
			goto out;
		}
		if (got == 0)
			break;
		n += (size_t)got;
	}
	if (n > PEER_SECRET_MAX) {
		r = fail(-EINVAL, err, errlen, path, "longer than %d bytes", PEER_SECRET_MAX);
		goto out;
	}
	while (n > 0 && (tmp[n - 1] == '\n' || tmp[n - 1] == '\r' || tmp[n - 1] == ' ' ||
			 tmp[n - 1] == '\t'))
		n--;
	if (n < PEER_SECRET_MIN) {
		r = fail(-EINVAL, err, errlen, path,
			 "%zu bytes of secret, fewer than %d (make one with: head -c 32 "
			 "/dev/urandom | base64)",
			 n, PEER_SECRET_MIN);
		goto out;
	}
	memcpy(buf, tmp, n);
	*ret_len = n;
out:
	OPENSSL_cleanse(tmp, sizeof(tmp));
	close(fd);
	return r;
}

static bool text_byte(uint8_t c)
{
	return (c >= 0x20 && c < 0x7f) || c == '\n' || c == '\r' || c == '\t';
}

int peer_secret_split(const char *path, uint8_t *buf, size_t len, size_t *first_len,
		      const uint8_t **second, size_t *second_len, char *err, size_t errlen)
{
	size_t at[3], n[3], k = 0, i = 0;

	*second = NULL;
	*second_len = 0;
	for (size_t j = 0; j < len; j++)
		if (!text_byte(buf[j])) { /* a binary secret: the whole file, as loaded */
			*first_len = len;
			return 0;
		}
	while (i < len) {
		size_t s = i, e;

		while (i < len && buf[i] != '\n')
			i++;
		e = i++;
		while (s < e && (buf[s] == ' ' || buf[s] == '\t'))
			s++;
		while (e > s && (buf[e - 1] == ' ' || buf[e - 1] == '\t' || buf[e - 1] == '\r'))
			e--;
		if (e == s)
			continue; /* a blank line */
		if (k == 2)
			return fail(-EINVAL, err, errlen, path,
				    "more than two secrets (one line each: the one this node "
				    "proves with, and one it also accepts while rotating)");
		at[k] = s;
		n[k++] = e - s;
	}
	for (size_t j = 0; j < k; j++)
		if (n[j] < PEER_SECRET_MIN)
			return fail(-EINVAL, err, errlen, path,
				    "line %zu: %zu bytes of secret, fewer than %d", j + 1, n[j],
				    PEER_SECRET_MIN);
	if (k == 0)
		return fail(-EINVAL, err, errlen, path, "no secret in it");
	memmove(buf, buf + at[0], n[0]);
	if (k == 2) {
		/* The second lies after the first's end: it was not overwritten. */
		*second = buf + at[1];
		*second_len = n[1];
	}
	*first_len = n[0];
	return 0;
}
