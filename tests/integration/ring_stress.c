/*
 * ring_stress: threads of one client put new versions of their names into
 * recycled memory (docs/recycle.md) while threads of another client attach
 * them, so that ring buffers cycle, the copy pool shares large copies, the
 * flusher gives idle buffers back (TENSORD_RECYCLE_IDLE_MS short) and
 * releases race with creates, all at once. Run under TSan and ASan by
 * tests/integration/test_recycle_threads.py.
 *
 *   ring_stress SOCKET SECONDS
 *
 * Every version of a name holds one int64 value in every element; a reader
 * checks each tensor it attaches is whole and never older than one it saw
 * before. Prints "ok puts=N attaches=M" or "err ..." and exits 0 or 1.
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

#define WRITERS 2
#define READERS 2

static const int64_t elems[WRITERS] = { 128 * 1024, 2 * 1024 * 1024 }; /* 1 MiB, 16 MiB */
static tensord_client *wc, *rc;
static atomic_bool done;
static atomic_ulong n_put, n_attached;
static atomic_llong last[WRITERS];

static void *writer(void *arg)
{
	int k = (int)(intptr_t)arg;
	int64_t n = elems[k];
	int64_t *buf = malloc((size_t)n * sizeof(*buf));
	DLTensor t = { .data = buf,
		       .device = { kDLCPU, 0 },
		       .ndim = 1,
		       .dtype = { kDLInt, 64, 1 },
		       .shape = &n };
	char name[32];

	snprintf(name, sizeof(name), "ring/%d", k);
	for (int64_t v = 1; buf && !atomic_load(&done); v++) {
		for (int64_t i = 0; i < n; i++)
			buf[i] = v;
		if (tensord_put(wc, name, &t, TENSORD_REPLACE, 0644) < 0) {
			fail("put", name);
			break;
		}
		atomic_store(&last[k], v);
		atomic_fetch_add(&n_put, 1);
		/* Now and then a pause past the idle time: buffers go back. */
		if (v % 97 == 0)
			usleep(60 * 1000);
	}
	free(buf);
	return NULL;
}

static void *reader(void *arg)
{
	int64_t seen[WRITERS] = { 0 };

	(void)arg;
	while (!atomic_load(&done) && !atomic_load(&failed)) {
		for (int k = 0; k < WRITERS; k++) {
			DLManagedTensorVersioned *t;
			const int64_t *x;
			char name[32];
			int64_t n;

			snprintf(name, sizeof(name), "ring/%d", k);
			int e = tensord_attach(rc, name, 0, &t);

			if (e == -ENOENT)
				continue;
			if (e < 0) {
				fail("attach", name);
				return NULL;
			}
			x = (const int64_t *)t->dl_tensor.data;
			n = t->dl_tensor.shape[0];
			if (n != elems[k] || x[0] < seen[k]) {
				fail("older or wrong size", name);
			} else {
				for (int64_t i = 0; i < n; i++)
					if (x[i] != x[0]) {
						fail("mixed versions in", name);
						break;
					}
				seen[k] = x[0];
			}
			t->deleter(t);
			atomic_fetch_add(&n_attached, 1);
		}
	}
	return NULL;
}

int main(int argc, char **argv)
{
	pthread_t w[WRITERS], r[READERS];
	double end;

	if (argc != 3) {
		fprintf(stderr, "usage: ring_stress SOCKET SECONDS\n");
		return 2;
	}
	end = now_s() + atof(argv[2]);
	if (tensord_connect(argv[1], &wc) < 0 || tensord_connect(argv[1], &rc) < 0) {
		printf("err connect: %s\n", tensord_last_error());
		return 1;
	}
	for (int i = 0; i < WRITERS; i++)
		pthread_create(&w[i], NULL, writer, (void *)(intptr_t)i);
	for (int i = 0; i < READERS; i++)
		pthread_create(&r[i], NULL, reader, NULL);
	while (now_s() < end && !atomic_load(&failed))
		usleep(10 * 1000);
	atomic_store(&done, true);
	for (int i = 0; i < WRITERS; i++)
		pthread_join(w[i], NULL);
	for (int i = 0; i < READERS; i++)
		pthread_join(r[i], NULL);
	tensord_close(rc);
	tensord_close(wc);
	if (atomic_load(&failed))
		return 1;
	printf("ok puts=%lu attaches=%lu\n", atomic_load(&n_put), atomic_load(&n_attached));
	return 0;
}
