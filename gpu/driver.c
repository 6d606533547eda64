/*
 * Loading GPU driver libraries at run time, for every vendor's shim. See
 * driver.h.
 *
 * Symbols are looked up with plain dlsym by the exported names the shims
 * give (versioned where the driver versions them: cuMemAlloc_v2), never
 * through a driver call such as cuGetProcAddress: the exported name pins
 * the ABI the shim's prototype was written for, and a broken or stub
 * driver is then reported by its own first call with its own error code
 * instead of by the loader.
 */
#include <dlfcn.h>
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "driver.h"

void *td_gpu_dlopen(const char *const *sonames, const char **ret_soname, char *why, size_t why_len)
{
	for (int i = 0; sonames[i]; i++) {
		void *lib = dlopen(sonames[i], RTLD_NOW | RTLD_LOCAL);
		const char *e;

		if (lib) {
			if (ret_soname)
				*ret_soname = sonames[i];
			return lib;
		}
		/* Keep the last reason; dlerror() names the library. */
		e = dlerror();
		snprintf(why, why_len, "%s", e ? e : sonames[i]);
	}
	return NULL;
}

int td_gpu_dlsym(void *lib, const char *soname, const struct td_gpu_sym *syms, size_t n,
		 void *table, const char *hint, char *why, size_t why_len)
{
	unsigned missing = 0; /* bit g: an entry of group g is missing */
	void *none = NULL;

	for (size_t i = 0; i < n; i++) {
		const struct td_gpu_sym *s = &syms[i];
		void *fn = dlsym(lib, s->name);

		if (!fn && s->alt)
			fn = dlsym(lib, s->alt);
		if (!fn && s->group == 0) {
			snprintf(why, why_len, "%s: no symbol %s%s", soname, s->name, hint);
			return -ENODEV;
		}
		if (!fn)
			missing |= 1u << s->group;
		/* POSIX guarantees function pointers survive a trip through void *. */
		memcpy((char *)table + s->offset, &fn, sizeof(fn));
	}
	for (size_t i = 0; i < n; i++)
		if (syms[i].group && (missing & (1u << syms[i].group)))
			memcpy((char *)table + syms[i].offset, &none, sizeof(none));
	return 0;
}

int td_gpu_driver_get(struct td_gpu_driver *d, void (*load)(void), const void **ret_table,
		      const char **ret_why)
{
	const void *forced = d->forced;

	if (forced) {
		*ret_table = forced;
		return 0;
	}
	pthread_once(&d->once, load);
	if (d->status < 0) {
		if (ret_why)
			*ret_why = d->why;
		return d->status;
	}
	*ret_table = d->table;
	return 0;
}

void td_gpu_driver_use(struct td_gpu_driver *d, const void *table)
{
	d->forced = table;
}

bool td_gpu_driver_in_use(const struct td_gpu_driver *d)
{
	return d->forced || d->loaded;
}
