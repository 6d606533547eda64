/*
 * The daemon's clock: CLOCK_MONOTONIC in nanoseconds, the one every
 * deadline, age and measured time of the daemon's is read on (a lease's
 * age, a pull's deadline, a peer's heartbeat, the loop's polling).
 */
#ifndef TENSORD_CLOCK_H
#define TENSORD_CLOCK_H

#include <stdint.h>
#include <time.h>

static inline uint64_t now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

#endif /* TENSORD_CLOCK_H */
