/*
 * Peer authentication: how two tensord daemons prove to each other that
 * they hold the same shared secret before anything else passes between
 * them (docs/remote.md, "Authentication"). A pure module: no sockets, no
 * UCX, no loop; the peer connection code feeds it the other side's
 * messages and sends what it produces.
 *
 * The exchange, between the daemon that dialled (D) and the one that
 * listened (L):
 *
 *   D -> L  Hello: name_D, nonce_D
 *   L -> D  Hello: name_L, nonce_L, proof_L
 *   D -> L  Proof: proof_D
 *
 *   proof_X = HMAC-SHA256(secret, label_X || transcript), each label with its NUL
 *   transcript = u8 len(name_D) || name_D || u8 len(name_L) || name_L
 *                || nonce_D || nonce_L
 *   label_D = "tensord-peer-v1 dialler", label_L = "tensord-peer-v1 listener"
 *   session key = HMAC-SHA256(secret, "tensord-peer-v1 session" || transcript)
 *
 * What each part is for:
 *  - fresh random nonces from both sides: a recorded proof is no proof in
 *    a later exchange (replay);
 *  - a label per direction: a side's own proof sent back to it is not the
 *    other side's proof (reflection);
 *  - both names inside: a proof made between two nodes is no proof
 *    between two others; and a peer claiming this node's own name is
 *    refused, which closes the one reflection the labels leave open (an
 *    attacker relaying between two connections of the same node, one
 *    dialled and one accepted);
 *  - proofs compared in constant time.
 *
 * The secret is HMAC's key, so it is never sent, and a passive observer
 * learns proofs of random transcripts only. The HMAC is OpenSSL's
 * libcrypto (docs/remote.md says why it and not TLS or libsodium).
 */
#ifndef TENSORD_PEER_AUTH_H
#define TENSORD_PEER_AUTH_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define PEER_AUTH_NONCE_LEN 32
#define PEER_AUTH_MAC_LEN 32 /* a proof and a session key: SHA-256 sized */
/* A node's name: 1 to 63 bytes of [A-Za-z0-9._-] (a DNS label, with dots). */
#define PEER_NAME_MAX 63
/* A secret shorter than this is refused: 32 bytes is SHA-256's own strength. */
#define PEER_SECRET_MIN 32
#define PEER_SECRET_MAX 4096

enum peer_auth_role {
	PEER_AUTH_DIALLER,  /* this side connected */
	PEER_AUTH_LISTENER, /* this side accepted */
};

/*
 * One side of one handshake. Holds a copy of the secret; peer_auth_fini()
 * wipes it. The fields are private to peer_auth.c.
 */
struct peer_auth {
	enum peer_auth_role role;
	uint8_t secret[PEER_SECRET_MAX];
	size_t secret_len;
	uint8_t also[PEER_SECRET_MAX]; /* a second secret whose proofs pass too (rotation) */
	size_t also_len;               /* 0: none */
	char self[PEER_NAME_MAX + 1];
	char other[PEER_NAME_MAX + 1];
	uint8_t nonce_self[PEER_AUTH_NONCE_LEN];
	uint8_t nonce_other[PEER_AUTH_NONCE_LEN];
	bool have_other; /* peer_auth_set_peer() succeeded */
	bool verified;   /* peer_auth_verify() succeeded */
};

/* Whether name is a valid node name (see PEER_NAME_MAX); len bytes, no NUL needed. */
bool peer_name_valid(const char *name, size_t len);

/*
 * Starts one side of a handshake as self_name, with the shared secret
 * (copied), and draws this side's nonce. 0; -EINVAL for a bad name or a
 * secret outside PEER_SECRET_MIN..PEER_SECRET_MAX bytes; -EIO when no
 * random bytes could be had.
 */
int peer_auth_init(struct peer_auth *a, enum peer_auth_role role, const char *self_name,
		   const uint8_t *secret, size_t secret_len);

/*
 * During a rotation of the shared secret: proofs made with secret (copied)
 * pass peer_auth_verify() too; this side still proves with the first. 0, or
 * -EINVAL for a secret outside PEER_SECRET_MIN..PEER_SECRET_MAX bytes.
 */
int peer_auth_also_accept(struct peer_auth *a, const uint8_t *secret, size_t secret_len);

/* This side's nonce, for its Hello. Borrowed: valid until peer_auth_fini(). */
const uint8_t *peer_auth_nonce(const struct peer_auth *a);

/*
 * Takes the other side's Hello: its name (name_len bytes) and its nonce.
 * Once per handshake. 0; -EINVAL for a bad name; -ELOOP when it is this
 * node's own name (refused: see above); -EPROTO for a nonce that is not
 * PEER_AUTH_NONCE_LEN bytes, or a second call.
 */
int peer_auth_set_peer(struct peer_auth *a, const char *name, size_t name_len, const uint8_t *nonce,
		       size_t nonce_len);

/*
 * This side's proof into out (PEER_AUTH_MAC_LEN bytes). The listener
 * proves first (in its Hello); the dialler only once the listener's proof
 * passed peer_auth_verify(), so that it proves nothing to a side that has
 * not proved itself. 0; -EPROTO before peer_auth_set_peer(), or for a
 * dialler not yet verified; -EIO when the HMAC failed.
 */
int peer_auth_prove(const struct peer_auth *a, uint8_t out[PEER_AUTH_MAC_LEN]);

/*
 * Checks the other side's proof (len bytes). 0: it holds the secret, this
 * handshake's; -EACCES: it does not (wrong secret, or a proof of another
 * exchange or of the other direction); -EPROTO: before
 * peer_auth_set_peer(), or a proof that is not PEER_AUTH_MAC_LEN bytes;
 * -EIO when the HMAC failed. The comparison takes the same time whatever
 * the bytes.
 */
int peer_auth_verify(struct peer_auth *a, const uint8_t *proof, size_t len);

/*
 * The session key both sides derive, into out (PEER_AUTH_MAC_LEN bytes),
 * for the MACs of later frames. 0; -EPERM until peer_auth_verify() has
 * succeeded; -EIO when the HMAC failed.
 */
int peer_auth_session_key(const struct peer_auth *a, uint8_t out[PEER_AUTH_MAC_LEN]);

/* Wipes the secret and the nonces. NULL is a no-op. */
void peer_auth_fini(struct peer_auth *a);

/*
 * Reads the shared secret from path into buf (cap bytes, at least
 * PEER_SECRET_MAX), as ssh reads a private key: path must be a regular
 * file (not followed if it is a symbolic link) owned by root or by this
 * process's effective uid, that neither group nor others may read, write
 * or execute, of at most PEER_SECRET_MAX bytes; trailing blanks and
 * newlines are not part of the secret, which must then be at least
 * PEER_SECRET_MIN bytes. 0 and *ret_len; or -errno with a message naming
 * path and the reason in err (errlen bytes, always terminated):
 * -ENOENT and the like from open(), -ELOOP a symbolic link, -EINVAL not a
 * regular file, too short or too long, -EPERM its owner or its mode.
 */
int peer_secret_load(const char *path, uint8_t *buf, size_t cap, size_t *ret_len, char *err,
		     size_t errlen);

/*
 * The secrets of a file peer_secret_load() read (buf, len bytes): a file
 * of text (printable ASCII and line ends) holds one secret per line, at
 * most two, blank lines ignored: the first is the one this node proves
 * with, a second one it accepts as well (to rotate the secret without a
 * moment where two nodes disagree: docs/operating.md, "Peers"). Any other
 * file is one binary secret, as before. On success *first_len and, for a
 * second, *second (into buf) and *second_len (0: none); the first is moved
 * to buf's start. -EINVAL with the reason in err (naming path): more than
 * two, or one shorter than PEER_SECRET_MIN bytes.
 */
int peer_secret_split(const char *path, uint8_t *buf, size_t len, size_t *first_len,
		      const uint8_t **second, size_t *second_len, char *err, size_t errlen);

#endif /* TENSORD_PEER_AUTH_H */
