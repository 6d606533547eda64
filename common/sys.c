/* Small system helpers shared by the daemon and the client library (sys.h). */
#include <errno.h>
#include <sched.h>
#include <stdlib.h>
#include <unistd.h>

#include "sys.h"

#define SPIN_US_DEFAULT 50

int td_pwrite_all(int fd, const void *data, size_t n, uint64_t off)
{
	const uint8_t *p = data;

	while (n) {
		ssize_t k = pwrite(fd, p, n < (1u << 30) ? n : (1u << 30), (off_t)off);

		if (k < 0 && errno == EINTR)
			continue;
		if (k <= 0)
			return k < 0 ? -errno : -EIO;
		p += k;
		off += (uint64_t)k;
		n -= (size_t)k;
	}
	return 0;
}

unsigned td_spin_budget_us(void)
{
	static int cached = -1; /* racing first calls compute the same value */
	int us = __atomic_load_n(&cached, __ATOMIC_RELAXED);

	if (us < 0) {
		const char *e = getenv("TENSORD_SPIN_US");
		cpu_set_t set;

		if (e && *e)
			us = atoi(e) > 0 ? atoi(e) : 0;
		else if (sched_getaffinity(0, sizeof(set), &set) == 0 && CPU_COUNT(&set) > 1)
			us = SPIN_US_DEFAULT;
		else
			us = 0;
		__atomic_store_n(&cached, us, __ATOMIC_RELAXED);
	}
	return (unsigned)us;
}
