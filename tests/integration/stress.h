/*
 * What the threaded stress programs (bind_stress.c, ring_stress.c and
 * readopt_stress.c) share: a monotonic clock in seconds for their run's
 * end, and the first failure, printed once, after which every thread
 * stops and the program exits 1. Each program is one file linked with
 * libtensord (the Makefile's tests/helpers rule), so all of it is static.
 */
#ifndef TENSORD_TESTS_STRESS_H
#define TENSORD_TESTS_STRESS_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <time.h>

#include <tensord/tensord.h>

/* Set by the first fail(): the threads and the main loop stop at it. */
static atomic_bool failed;

static inline double now_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static inline void fail(const char *what, const char *name)
{
	if (!atomic_exchange(&failed, true))
		printf("err %s %s: %s\n", what, name, tensord_last_error());
}

#endif
