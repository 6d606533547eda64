/*
 * The hash of a tensor name, for the daemon's tables (registry, waiters):
 * FNV-1a, 64 bits. Names are checked before they get here, and tables
 * grow with what they hold, so a simple hash is enough.
 */
#ifndef TENSORD_COMMON_HASH_H
#define TENSORD_COMMON_HASH_H

#include <stddef.h>
#include <stdint.h>

static inline uint64_t td_hash_name(const char *s, size_t len)
{
	uint64_t h = 1469598103934665603ull;

	for (size_t i = 0; i < len; i++) {
		h ^= (unsigned char)s[i];
		h *= 1099511628211ull;
	}
	return h;
}

#endif
