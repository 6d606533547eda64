/*
 * bind_stress: threads of one client attach and release names served from
 * bindings (docs/design.md, "Attach without a round trip") while another
 * connection of the same process replaces and unlinks them, so that the
 * fast path, the watcher thread, idle expiry and sweeps all run at once.
 * Run under TSan and ASan by tests/integration/test_bindings_threads.py.
 *
 *   bind_stress SOCKET SECONDS
 *
 * Every version of a name holds one int64 value in every element; a reader
 * checks each tensor it attaches is whole and never older than one it saw
 * before. First, many names bound at once (more slots than the daemon's
 * first chunk of them), half unlinked while held. Prints "ok attaches=N
 * missing=M ..." or "err ..." and exits 0 or 1.
 */
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <tensord/tensord.h>

#include "stress.h"

#define NAMES 4
#define ELEMS 512
#define READERS 3

static tensord_client *rc;
static atomic_bool done;
static atomic_ulong n_attached, n_missing;

static int put(tensord_client *c, const char *name, int64_t value, bool replace)
{
	static int64_t buf[ELEMS];
	int64_t shape = ELEMS;
	DLTensor t = { .data = buf,
		       .device = { kDLCPU, 0 },
		       .ndim = 1,
		       .dtype = { kDLInt, 64, 1 },
		       .shape = &shape };

	for (int i = 0; i < ELEMS; i++)
		buf[i] = value;
	return tensord_put(c, name, &t, replace ? TENSORD_REPLACE : 0, 0);
}

static void *reader(void *arg)
{
	int64_t last[NAMES] = { 0 };
	unsigned seed = (unsigned)(uintptr_t)arg;

	while (!atomic_load(&done) && !atomic_load(&failed)) {
		DLManagedTensorVersioned *held[8];
		int k = rand_r(&seed) % NAMES, n = 1 + rand_r(&seed) % 8, got = 0;
		char name[32];

		snprintf(name, sizeof(name), "stress/%d", k);
		for (int i = 0; i < n; i++) {
			int r = tensord_attach(rc, name, 0, &held[got]);

			if (r == -ENOENT) {
				atomic_fetch_add(&n_missing, 1);
				continue;
			}
			if (r < 0) {
				fail("attach", name);
				break;
			}
			got++;
		}
		for (int i = 0; i < got; i++) {
			const int64_t *v = held[i]->dl_tensor.data;

			for (int e = 0; e < ELEMS; e++) {
				if (v[e] != v[0]) {
					fail("torn tensor", name);
					break;
				}
			}
			if (v[0] < last[k])
				fail("went back in time", name);
			last[k] = v[0];
			atomic_fetch_add(&n_attached, 1);
		}
		for (int i = 0; i < got; i++)
			held[i]->deleter(held[i]);
	}
	return NULL;
}

#define MANY 600

/* MANY names bound at once on rc, held; half of them unlinked, then all let go. */
static int many_bound(tensord_client *wc)
{
	static DLManagedTensorVersioned *held[MANY][2];
	char name[32];

	for (int i = 0; i < MANY; i++) {
		snprintf(name, sizeof(name), "many/%d", i);
		if (put(wc, name, i, false) < 0)
			return fail("put", name), -1;
		/* The first a round trip that binds, the second served from it. */
		for (int k = 0; k < 2; k++)
			if (tensord_attach(rc, name, 0, &held[i][k]) < 0)
				return fail("attach", name), -1;
	}
	for (int i = 0; i < MANY; i += 2) {
		snprintf(name, sizeof(name), "many/%d", i);
		if (tensord_unlink(wc, name) < 0)
			return fail("unlink", name), -1;
	}
	for (int i = 0; i < MANY; i++) {
		DLManagedTensorVersioned *t;
		int r;

		snprintf(name, sizeof(name), "many/%d", i);
		if (*(const int64_t *)held[i][1]->dl_tensor.data != i)
			return fail("wrong bytes", name), -1;
		r = tensord_attach(rc, name, 0, &t);
		if (i % 2 == 0 && r != -ENOENT)
			return fail("attached after its unlink", name), -1;
		if (i % 2 && r < 0)
			return fail("attach", name), -1;
		if (r == 0)
			t->deleter(t);
		held[i][0]->deleter(held[i][0]);
		held[i][1]->deleter(held[i][1]);
	}
	for (int i = 1; i < MANY; i += 2) {
		snprintf(name, sizeof(name), "many/%d", i);
		if (tensord_unlink(wc, name) < 0)
			return fail("unlink", name), -1;
	}
	return 0;
}

int main(int argc, char **argv)
{
	pthread_t th[READERS];
	tensord_client *wc;
	double end;
	int64_t version = 1;

	if (argc != 3) {
		fprintf(stderr, "usage: bind_stress SOCKET SECONDS\n");
		return 2;
	}
	if (tensord_connect(argv[1], &wc) < 0 || tensord_connect(argv[1], &rc) < 0) {
		printf("err connect: %s\n", tensord_last_error());
		return 1;
	}
	if (many_bound(wc) < 0)
		return 1;
	for (int k = 0; k < NAMES; k++) {
		char name[32];

		snprintf(name, sizeof(name), "stress/%d", k);
		if (put(wc, name, version, false) < 0) {
			fail("put", name);
			return 1;
		}
	}
	for (int i = 0; i < READERS; i++)
		pthread_create(&th[i], NULL, reader, (void *)(uintptr_t)(i + 1));
	end = now_s() + atof(argv[2]);
	while (now_s() < end && !atomic_load(&failed)) {
		char name[32];
		int k = (int)(version % NAMES);

		version++;
		snprintf(name, sizeof(name), "stress/%d", k);
		/* Replace, or unlink and put again: both clear the bindings. */
		if (version % 3 == 0) {
			if (tensord_unlink(wc, name) < 0 || put(wc, name, version, false) < 0)
				fail("unlink and put", name);
		} else if (put(wc, name, version, true) < 0) {
			fail("replace", name);
		}
	}
	atomic_store(&done, true);
	for (int i = 0; i < READERS; i++)
		pthread_join(th[i], NULL);
	tensord_close(rc);
	tensord_close(wc);
	if (atomic_load(&failed))
		return 1;
	printf("ok attaches=%lu missing=%lu versions=%lld\n", atomic_load(&n_attached),
	       atomic_load(&n_missing), (long long)version);
	return 0;
}
