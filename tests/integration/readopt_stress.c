/*
 * readopt_stress: threads of one client attach, hold and release tensors
 * while the test kills and restarts the daemon behind them, so that leases
 * are re-adopted (docs/restart.md, 0.3) while other threads take new ones
 * and end old ones on the same client, all at once. Run under TSan and
 * ASan by tests/integration/test_readopt_threads.py.
 *
 *   readopt_stress SOCKET SECONDS NAMES
 *
 * Tensor "ro/K" (K < NAMES) holds the int64 value K in every element. Each
 * thread keeps up to HELD tensors, checks each is whole when it takes it
 * and again when it lets it go (its mapping must outlive the daemon), and
 * counts the calls that failed while no daemon answered. Prints "ok
 * attaches=N failed=M" or "err ..." and exits 0 or 1.
 */
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <tensord/tensord.h>

#include "stress.h"

#define THREADS 3
#define HELD 4

static tensord_client *c;
static int names;
static atomic_bool done;
static atomic_ulong n_attached, n_failed;

/* Whether t holds value k in every element. */
static bool whole(const DLManagedTensorVersioned *t, int64_t k)
{
	const int64_t *x = (const int64_t *)t->dl_tensor.data;

	for (int64_t i = 0; i < t->dl_tensor.shape[0]; i++)
		if (x[i] != k)
			return false;
	return true;
}

static void *worker(void *arg)
{
	DLManagedTensorVersioned *held[HELD] = { 0 };
	int64_t held_k[HELD] = { 0 };
	unsigned seed = (unsigned)(uintptr_t)arg * 7919u + 1;

	for (unsigned i = 0; !atomic_load(&done) && !atomic_load(&failed); i++) {
		int slot = (int)(i % HELD);
		int64_t k = rand_r(&seed) % names;
		DLManagedTensorVersioned *t;
		char name[32];
		int e;

		if (held[slot]) {
			snprintf(name, sizeof(name), "ro/%lld", (long long)held_k[slot]);
			if (!whole(held[slot], held_k[slot]))
				fail("changed while held", name);
			held[slot]->deleter(held[slot]);
			held[slot] = NULL;
		}
		snprintf(name, sizeof(name), "ro/%lld", (long long)k);
		e = tensord_attach(c, name, 0, &t);
		if (e == -ECONNREFUSED || e == -ECONNRESET || e == -EPIPE || e == -ETIMEDOUT) {
			/* No daemon for a while: a restart takes one. */
			atomic_fetch_add(&n_failed, 1);
			usleep(5 * 1000);
			continue;
		}
		if (e < 0) {
			fail("attach", name);
			break;
		}
		if (!whole(t, k))
			fail("not whole", name);
		held[slot] = t;
		held_k[slot] = k;
		atomic_fetch_add(&n_attached, 1);
	}
	for (int s = 0; s < HELD; s++)
		if (held[s])
			held[s]->deleter(held[s]);
	return NULL;
}

int main(int argc, char **argv)
{
	pthread_t th[THREADS];
	double end;

	if (argc != 4) {
		fprintf(stderr, "usage: readopt_stress SOCKET SECONDS NAMES\n");
		return 2;
	}
	end = now_s() + atof(argv[2]);
	names = atoi(argv[3]);
	if (names <= 0 || tensord_connect(argv[1], &c) < 0) {
		printf("err connect: %s\n", tensord_last_error());
		return 1;
	}
	for (int i = 0; i < THREADS; i++)
		pthread_create(&th[i], NULL, worker, (void *)(intptr_t)i);
	while (now_s() < end && !atomic_load(&failed))
		usleep(10 * 1000);
	atomic_store(&done, true);
	for (int i = 0; i < THREADS; i++)
		pthread_join(th[i], NULL);
	tensord_close(c);
	if (atomic_load(&failed))
		return 1;
	printf("ok attaches=%lu failed=%lu\n", atomic_load(&n_attached), atomic_load(&n_failed));
	return 0;
}
