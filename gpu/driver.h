/*
 * What the GPU driver shims (gpu/<id>/<id>_api.c) share: opening a
 * vendor's driver library at run time and filling its table of entry
 * points (dlopen + dlsym only, so that neither the daemon nor the client
 * library links a GPU library), and the process-wide table that the first
 * caller loads and a unit test may replace with fakes. A shim adds what
 * differs: the library's names, its entry points, and what makes the
 * driver ready (cuInit, the runtime's version).
 */
#ifndef TENSORD_GPU_DRIVER_H
#define TENSORD_GPU_DRIVER_H

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>

/* One entry point of a driver library. */
struct td_gpu_sym {
	const char *name; /* the exported symbol, "cuMemAlloc_v2" */
	const char *alt;  /* an older name with the same prototype, or NULL */
	size_t offset;    /* of its function pointer in the table */
	int group;        /* 0: required; 1..31: optional, all of the group or none */
};

/*
 * Opens the first of the NULL-terminated sonames that loads, and puts its
 * name in *ret_soname (ret_soname may be NULL). The handle, or NULL with
 * why: the last dlopen error, which names the library.
 */
void *td_gpu_dlopen(const char *const *sonames, const char **ret_soname, char *why, size_t why_len);

/*
 * Fills table from lib: each of the n entry points, by its name or else
 * its alt, goes to its offset. 0; or -ENODEV when a required one is
 * missing, with why "<soname>: no symbol <name><hint>". An optional one
 * missing leaves every entry of its group NULL: half of a group (VMM)
 * would fail half-way through its work.
 */
int td_gpu_dlsym(void *lib, const char *soname, const struct td_gpu_sym *syms, size_t n,
		 void *table, const char *hint, char *why, size_t why_len);

/*
 * A driver as one process sees it: the table its shim loads once, on the
 * first td_gpu_driver_get(), or the table a test installed. A shim keeps
 * one, static, initialised { .once = PTHREAD_ONCE_INIT, .table = &its
 * table }, and its load function fills status, why and loaded.
 */
struct td_gpu_driver {
	pthread_once_t once;
	const void *table;          /* what load fills; valid when status is 0 */
	int status;                 /* 0, or -ENODEV with why */
	char why[256];              /* starts with the library's name */
	_Atomic bool loaded;        /* the driver was made ready in this process */
	const void *_Atomic forced; /* td_gpu_driver_use()'s table, or NULL */
};

/*
 * The table: a test's if one is installed, else the one load() filled,
 * running load once per process (thread-safe). 0 and *ret_table, valid
 * for the life of the process; or d->status with *ret_why (ret_why may be
 * NULL), the same answer on every later call.
 */
int td_gpu_driver_get(struct td_gpu_driver *d, void (*load)(void), const void **ret_table,
		      const char **ret_why);

/* Makes later td_gpu_driver_get() calls return table (NULL: load as usual). Borrowed. */
void td_gpu_driver_use(struct td_gpu_driver *d, const void *table);

/*
 * Whether this process made the driver ready, or uses a test's table: a
 * child forked from it must make no driver call. Loads nothing.
 */
bool td_gpu_driver_in_use(const struct td_gpu_driver *d);

#endif /* TENSORD_GPU_DRIVER_H */
