/*
 * The driver double's core, compiled into each of its libraries (double.h
 * says what it models). Everything here is hidden (-fvisibility=hidden), so
 * libcuda.so.1 and libamdhip64.so.6 loaded in one process keep separate
 * state, as two real drivers would.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "double.h"

/* ---- the shared accounting file ------------------------------------------- */

enum rec_kind { REC_FREE, REC_CTX, REC_CREATOR, REC_IMPORTER };

struct rec {
	uint32_t pid;
	int32_t dev;
	uint32_t kind;
	uint32_t pad;
	uint64_t id;
	uint64_t bytes;
};

#define NREC 16384
struct shared {
	uint64_t magic;
	uint32_t hwm; /* records past this were never used */
	uint32_t pad;
	struct rec recs[NREC];
};
#define SHARED_MAGIC 0x7464677075646231ull /* "tdgpudb1" */

/* ---- this process's state -------------------------------------------------- */

struct op {
	int dev;
	uintptr_t stream;
	enum dbl_op op;
	void *dst;
	const void *src;
	int value;
	size_t n;
	bool faulted; /* what it touches was unmapped while it waited */
	struct op *next;
};

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static const char *vendor = "gpu";
static bool inited, forked, fork_reported;
static enum dbl_err poison;
static int ndev = 2, nvisible;
static int visible[DBL_MAX_DEV]; /* ordinal -> physical */
static uint64_t total = 8ull << 30, ctx_bytes = 64ull << 20;
static bool no_vmm, no_prot_read, no_peer, leaks;
static char dir[PATH_MAX - 64];
static int shared_fd = -1;
static struct shared *sh;
static uint32_t next_id;
static int ctx_held[DBL_MAX_DEV];
static struct dbl_alloc *allocs;
static struct dbl_map *maps, *reservations;
static struct op *ops, **ops_tail = &ops;

void dbl_lock(void)
{
	pthread_mutex_lock(&lock);
}

void dbl_unlock(void)
{
	pthread_mutex_unlock(&lock);
}

void dbl_report(const char *fmt, ...)
{
	char line[1024];
	va_list ap;
	int n, fd;

	n = snprintf(line, sizeof(line), "tensord-gpu-double[%d] %s: ", (int)getpid(), vendor);
	va_start(ap, fmt);
	n += vsnprintf(line + n, sizeof(line) - (size_t)n - 1, fmt, ap);
	va_end(ap);
	if (n > (int)sizeof(line) - 2)
		n = (int)sizeof(line) - 2;
	line[n++] = '\n';
	if (write(2, line, (size_t)n) < 0) {
		/* stderr gone: the report file below still says it */
	}
	char path[PATH_MAX];
	snprintf(path, sizeof(path), "%s/report", dir);
	fd = open(path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
	if (fd >= 0) {
		if (write(fd, line, (size_t)n) < 0) {
			/* nothing more to do: stderr had it */
		}
		close(fd);
	}
}

static uint64_t env_u64(const char *name, uint64_t def)
{
	const char *v = getenv(name);
	char *end;
	unsigned long long x;

	if (!v || !*v)
		return def;
	errno = 0;
	x = strtoull(v, &end, 0);
	return errno || *end ? def : x;
}

static bool env_on(const char *name)
{
	const char *v = getenv(name);

	return v && strcmp(v, "1") == 0;
}

void dbl_uuid_string(int physical, char out[41])
{
	uint8_t u[16];
	int n = 0;

	dbl_uuid(physical, u);
	n += snprintf(out + n, 41 - (size_t)n, "GPU-");
	for (int i = 0; i < 16; i++) {
		n += snprintf(out + n, 41 - (size_t)n, "%02x", u[i]);
		if (i == 3 || i == 5 || i == 7 || i == 9)
			n += snprintf(out + n, 41 - (size_t)n, "-");
	}
}

/* TD_GPU_DOUBLE_LEAKS: "1" for every process, else a program's name ("tensord"). */
static bool leaks_wanted(void)
{
	const char *v = getenv("TD_GPU_DOUBLE_LEAKS");

	return v && (strcmp(v, "1") == 0 || strcmp(v, program_invocation_short_name) == 0);
}

/* CUDA_VISIBLE_DEVICES: indexes or UUID prefixes; the list stops at the first bad entry. */
static void parse_visible(const char *var)
{
	const char *v = getenv(var);
	char buf[256], *save = NULL, *tok;

	nvisible = 0;
	if (!v) {
		for (int i = 0; i < ndev; i++)
			visible[nvisible++] = i;
		return;
	}
	snprintf(buf, sizeof(buf), "%s", v);
	for (tok = strtok_r(buf, ",", &save); tok && nvisible < ndev;
	     tok = strtok_r(NULL, ",", &save)) {
		int phys = -1;

		if (strncmp(tok, "GPU-", 4) == 0 || strncmp(tok, "GPU", 3) != 0) {
			char *end;
			long x = strtol(tok, &end, 10);

			if (*tok != 'G' && *end == '\0' && x >= 0 && x < ndev)
				phys = (int)x;
			for (int i = 0; i < ndev && *tok == 'G'; i++) {
				char s[41];

				dbl_uuid_string(i, s);
				if (strncmp(s, tok, strlen(tok)) == 0)
					phys = i;
			}
		}
		if (phys < 0)
			break;
		for (int i = 0; i < nvisible; i++)
			if (visible[i] == phys)
				phys = -1;
		if (phys < 0)
			break;
		visible[nvisible++] = phys;
	}
}

static void on_fork_child(void)
{
	/* The child's copy of the lock may be held by a thread that did not fork. */
	pthread_mutex_init(&lock, NULL);
	if (inited)
		forked = true;
}

static void open_shared(void)
{
	char path[PATH_MAX];
	struct stat st;

	if (mkdir(dir, 0700) < 0 && errno != EEXIST)
		return;
	snprintf(path, sizeof(path), "%s/%s.state", dir, vendor);
	shared_fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
	if (shared_fd < 0)
		return;
	flock(shared_fd, LOCK_EX);
	if (fstat(shared_fd, &st) == 0 && (size_t)st.st_size < sizeof(struct shared))
		if (ftruncate(shared_fd, sizeof(struct shared)) < 0) {
			flock(shared_fd, LOCK_UN);
			close(shared_fd);
			shared_fd = -1;
			return;
		}
	sh = mmap(NULL, sizeof(struct shared), PROT_READ | PROT_WRITE, MAP_SHARED, shared_fd, 0);
	if (sh == MAP_FAILED)
		sh = NULL;
	else if (sh->magic != SHARED_MAGIC) {
		memset(sh, 0, sizeof(*sh));
		sh->magic = SHARED_MAGIC;
	}
	flock(shared_fd, LOCK_UN);
}

enum dbl_err dbl_init(const char *visible_var)
{
	static bool read_env;

	if (forked)
		return dbl_check("init");
	if (!read_env) {
		const char *d = getenv("TD_GPU_DOUBLE_DIR");

		read_env = true;
		vendor = strstr(visible_var, "HIP") ? "hip" : "cuda";
		ndev = (int)env_u64("TD_GPU_DOUBLE_DEVICES", 2);
		if (ndev < 0 || ndev > DBL_MAX_DEV)
			ndev = 2;
		total = env_u64("TD_GPU_DOUBLE_MEM", 8ull << 30);
		ctx_bytes = env_u64("TD_GPU_DOUBLE_CTX_BYTES", 64ull << 20);
		no_vmm = env_on("TD_GPU_DOUBLE_NO_VMM");
		no_prot_read = env_on("TD_GPU_DOUBLE_NO_PROT_READ");
		no_peer = env_on("TD_GPU_DOUBLE_NO_PEER");
		leaks = leaks_wanted();
		if (d && *d)
			snprintf(dir, sizeof(dir), "%s", d);
		else
			snprintf(dir, sizeof(dir), "/tmp/tensord-gpu-double-%u",
				 (unsigned)getuid());
		parse_visible(visible_var);
		open_shared();
		pthread_atfork(NULL, NULL, on_fork_child);
	}
	inited = true;
	return nvisible ? DBL_OK : DBL_NO_DEVICE;
}

enum dbl_err dbl_check(const char *fn)
{
	if (forked) {
		if (!fork_reported) {
			fork_reported = true;
			dbl_report("violation: %s in a child forked after its parent used the "
				   "driver (%s does not survive fork)",
				   fn, strcmp(vendor, "hip") == 0 ? "HIP" : "CUDA");
		}
		return DBL_NOT_INITIALIZED;
	}
	if (!inited)
		return DBL_NOT_INITIALIZED;
	return poison;
}

int dbl_device_count(void)
{
	return nvisible;
}

int dbl_physical_count(void)
{
	return ndev;
}

int dbl_physical(int ordinal)
{
	return ordinal >= 0 && ordinal < nvisible ? visible[ordinal] : -1;
}

int dbl_ordinal(int physical)
{
	for (int i = 0; i < nvisible; i++)
		if (visible[i] == physical)
			return i;
	return -1;
}

void dbl_uuid(int physical, uint8_t out[16])
{
	static const uint8_t base[16] = { 0x74, 0x64, 0x67, 0x64, 0x00, 0x0b, 0x40, 0x00,
					  0x80, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00 };

	memcpy(out, base, 16);
	out[4] = strcmp(vendor, "hip") == 0 ? 0xa0 : 0xc0;
	out[15] = (uint8_t)physical;
}

uint64_t dbl_total_bytes(void)
{
	return total;
}

bool dbl_vmm(void)
{
	return !no_vmm;
}

bool dbl_prot_read(void)
{
	return !no_prot_read;
}

bool dbl_peer(int a, int b)
{
	return a == b || !no_peer;
}

/* ---- accounting ---------------------------------------------------------- */

static bool alive(uint32_t pid)
{
	char path[64], buf[256], *p;
	ssize_t n;
	int fd;

	if (kill((pid_t)pid, 0) < 0 && errno != EPERM)
		return false;
	/* A zombie's memory is gone already: the driver frees at exit, not at reaping. */
	snprintf(path, sizeof(path), "/proc/%u/stat", pid);
	fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return true;
	n = read(fd, buf, sizeof(buf) - 1);
	close(fd);
	if (n <= 0)
		return true;
	buf[n] = '\0';
	p = strrchr(buf, ')');
	return !(p && p[1] == ' ' && (p[2] == 'Z' || p[2] == 'X'));
}

static void shared_lock(void)
{
	if (shared_fd >= 0)
		flock(shared_fd, LOCK_EX);
}

static void shared_unlock(void)
{
	if (shared_fd >= 0)
		flock(shared_fd, LOCK_UN);
}

/* Drops the records of processes that are gone. shared_lock held. */
static void gc(void)
{
	for (uint32_t i = 0; i < sh->hwm; i++)
		if (sh->recs[i].kind != REC_FREE && !alive(sh->recs[i].pid))
			memset(&sh->recs[i], 0, sizeof(sh->recs[i]));
}

static void acct_add(enum rec_kind kind, int dev, uint64_t id, uint64_t bytes)
{
	if (!sh)
		return;
	shared_lock();
	for (uint32_t i = 0; i < NREC; i++) {
		if (i == sh->hwm)
			sh->hwm++;
		else if (sh->recs[i].kind != REC_FREE && alive(sh->recs[i].pid))
			continue;
		sh->recs[i] = (struct rec){ (uint32_t)getpid(), dev, kind, 0, id, bytes };
		break;
	}
	shared_unlock();
}

static void acct_del(enum rec_kind kind, int dev, uint64_t id)
{
	uint32_t me = (uint32_t)getpid();

	if (!sh)
		return;
	shared_lock();
	for (uint32_t i = 0; i < sh->hwm; i++) {
		struct rec *r = &sh->recs[i];

		if (r->pid == me && r->kind == kind && r->dev == dev && r->id == id) {
			memset(r, 0, sizeof(*r));
			break;
		}
	}
	shared_unlock();
}

uint64_t dbl_used_bytes(int physical)
{
	uint64_t sum = 0;

	if (!sh)
		return 0;
	shared_lock();
	gc();
	for (uint32_t i = 0; i < sh->hwm; i++) {
		struct rec *r = &sh->recs[i];
		bool seen = false;

		if (r->kind == REC_FREE || r->dev != physical)
			continue;
		if (r->kind == REC_CTX) {
			sum += r->bytes;
			continue;
		}
		/* An allocation counts once, however many processes hold it. */
		for (uint32_t j = 0; j < i && !seen; j++)
			seen = sh->recs[j].kind >= REC_CREATOR && sh->recs[j].id == r->id;
		if (!seen)
			sum += r->bytes;
	}
	shared_unlock();
	return sum;
}

bool dbl_pid_bytes(int physical, uint32_t pid, uint64_t *bytes)
{
	bool any = false;

	*bytes = 0;
	if (!sh)
		return false;
	shared_lock();
	for (uint32_t i = 0; i < sh->hwm; i++) {
		struct rec *r = &sh->recs[i];

		if (r->pid == pid && r->dev == physical &&
		    (r->kind == REC_CTX || r->kind == REC_CREATOR)) {
			*bytes += r->bytes;
			any = true;
		}
	}
	shared_unlock();
	return any;
}

int dbl_pids_on(int physical, uint32_t *pids, int max)
{
	int n = 0;

	if (!sh)
		return 0;
	shared_lock();
	gc();
	for (uint32_t i = 0; i < sh->hwm; i++) {
		struct rec *r = &sh->recs[i];
		bool dup = false;

		if (r->kind == REC_FREE || r->dev != physical)
			continue;
		for (int j = 0; j < n; j++)
			dup |= pids[j] == r->pid;
		if (!dup && n < max)
			pids[n++] = r->pid;
	}
	shared_unlock();
	return n;
}

void dbl_ctx_charge(int physical, bool on)
{
	if (on && ctx_held[physical]++ == 0)
		acct_add(REC_CTX, physical, 0, ctx_bytes);
	else if (!on && ctx_held[physical] > 0 && --ctx_held[physical] == 0)
		acct_del(REC_CTX, physical, 0);
}

/* Another live process that has this allocation open (its pid), or 0. */
static uint32_t other_holder(uint64_t id)
{
	uint32_t me = (uint32_t)getpid(), who = 0;

	if (!sh)
		return 0;
	shared_lock();
	for (uint32_t i = 0; i < sh->hwm && !who; i++) {
		struct rec *r = &sh->recs[i];

		if (r->kind == REC_IMPORTER && r->id == id && r->pid != me && alive(r->pid))
			who = r->pid;
	}
	shared_unlock();
	return who;
}

/* ---- allocations ------------------------------------------------------------ */

static struct dbl_alloc *alloc_add(uint64_t id, int fd, size_t size, int dev)
{
	struct dbl_alloc *a = calloc(1, sizeof(*a));

	if (!a)
		return NULL;
	*a = (struct dbl_alloc){ id, fd, size, dev, 1, false, allocs };
	allocs = a;
	return a;
}

enum dbl_err dbl_alloc_new(int physical, size_t size, struct dbl_alloc **ret)
{
	uint64_t id = (uint64_t)getpid() << 32 | ++next_id;
	char name[64];
	int fd;

	if (size == 0)
		return DBL_INVALID_VALUE;
	if (dbl_used_bytes(physical) + size > total)
		return DBL_OUT_OF_MEMORY;
	snprintf(name, sizeof(name), "tdgpu-%" PRIu64 "-%d", id, physical);
	fd = memfd_create(name, MFD_CLOEXEC);
	if (fd < 0)
		return DBL_OUT_OF_MEMORY;
	if (ftruncate(fd, (off_t)size) < 0 || !(*ret = alloc_add(id, fd, size, physical))) {
		close(fd);
		return DBL_OUT_OF_MEMORY;
	}
	acct_add(REC_CREATOR, physical, id, size);
	return DBL_OK;
}

/* The id and device of a double's memfd, from its name; false for anything else. */
static bool memfd_identity(int fd, uint64_t *id, int *dev, size_t *size)
{
	char path[64], target[256];
	struct stat st;
	ssize_t n;

	snprintf(path, sizeof(path), "/proc/self/fd/%d", fd);
	n = readlink(path, target, sizeof(target) - 1);
	if (n <= 0)
		return false;
	target[n] = '\0';
	if (sscanf(target, "/memfd:tdgpu-%" SCNu64 "-%d", id, dev) != 2 || *dev < 0 ||
	    *dev >= ndev || fstat(fd, &st) < 0)
		return false;
	*size = (size_t)st.st_size;
	return true;
}

/* This process's handle on allocation id, taking a reference; NULL if none. */
static struct dbl_alloc *alloc_known(uint64_t id)
{
	for (struct dbl_alloc *a = allocs; a; a = a->next)
		if (a->id == id) {
			a->refs++;
			return a;
		}
	return NULL;
}

enum dbl_err dbl_alloc_import(int fd, struct dbl_alloc **ret)
{
	uint64_t id;
	size_t size;
	int dev, mine;

	if (!memfd_identity(fd, &id, &dev, &size))
		return DBL_INVALID_VALUE;
	if ((*ret = alloc_known(id)))
		return DBL_OK;
	mine = fcntl(fd, F_DUPFD_CLOEXEC, 0);
	if (mine < 0)
		return DBL_OUT_OF_MEMORY;
	if (!(*ret = alloc_add(id, mine, size, dev))) {
		close(mine);
		return DBL_OUT_OF_MEMORY;
	}
	acct_add(REC_IMPORTER, dev, id, size);
	return DBL_OK;
}

bool dbl_alloc_live(const struct dbl_alloc *a)
{
	for (struct dbl_alloc *x = allocs; x; x = x->next)
		if (x == a)
			return true;
	return false;
}

void dbl_alloc_unref(struct dbl_alloc *a)
{
	if (--a->refs > 0)
		return;
	for (struct dbl_alloc **p = &allocs; *p; p = &(*p)->next)
		if (*p == a) {
			*p = a->next;
			break;
		}
	close(a->fd);
	acct_del((uint32_t)(a->id >> 32) == (uint32_t)getpid() ? REC_CREATOR : REC_IMPORTER, a->dev,
		 a->id);
	free(a);
}

/* ---- mappings --------------------------------------------------------------- */

static struct dbl_map *map_add(struct dbl_map **list, uintptr_t addr, size_t size,
			       enum dbl_map_kind kind, struct dbl_alloc *a)
{
	struct dbl_map *m = calloc(1, sizeof(*m));

	if (!m)
		return NULL;
	*m = (struct dbl_map){ .addr = addr, .size = size, .kind = kind, .alloc = a, .refs = 1 };
	m->next = *list;
	*list = m;
	return m;
}

static void map_del(struct dbl_map **list, struct dbl_map *m)
{
	for (struct dbl_map **p = list; *p; p = &(*p)->next)
		if (*p == m) {
			*p = m->next;
			break;
		}
	free(m);
}

struct dbl_map *dbl_map_at(uintptr_t addr)
{
	for (struct dbl_map *m = maps; m; m = m->next)
		if (m->addr == addr)
			return m;
	return NULL;
}

struct dbl_map *dbl_map_find(uintptr_t addr, size_t n)
{
	for (struct dbl_map *m = maps; m; m = m->next)
		if (addr >= m->addr && addr - m->addr < m->size && n <= m->size - (addr - m->addr))
			return m;
	return NULL;
}

/* Whether addr lies in memory the double handed out (mapped or reserved). */
static bool in_device_space(uintptr_t addr)
{
	for (struct dbl_map *m = maps; m; m = m->next)
		if (addr >= m->addr && addr - m->addr < m->size)
			return true;
	for (struct dbl_map *m = reservations; m; m = m->next)
		if (addr >= m->addr && addr - m->addr < m->size)
			return true;
	return false;
}

static void mirror_protection(struct dbl_map *m)
{
	int prot = PROT_NONE;

	for (int d = 0; d < DBL_MAX_DEV; d++) {
		if (m->access[d] == DBL_RW)
			prot = PROT_READ | PROT_WRITE;
		else if (m->access[d] == DBL_READ && prot == PROT_NONE)
			prot = PROT_READ;
	}
	mprotect((void *)m->addr, m->size, prot);
}

enum dbl_err dbl_map_own(struct dbl_alloc *a, int physical, struct dbl_map **ret)
{
	void *p = mmap(NULL, a->size, PROT_READ | PROT_WRITE, MAP_SHARED, a->fd, 0);

	if (p == MAP_FAILED)
		return DBL_OUT_OF_MEMORY;
	*ret = map_add(&maps, (uintptr_t)p, a->size, DBL_MAP_OWN, a);
	if (!*ret) {
		munmap(p, a->size);
		return DBL_OUT_OF_MEMORY;
	}
	for (int d = 0; d < ndev; d++)
		(*ret)->access[d] = dbl_peer(physical, d) ? DBL_RW : DBL_NONE;
	return DBL_OK;
}

/* Queued work that touches [addr, addr + size): marked faulted, and counted. */
static int pending_on(uintptr_t addr, size_t size)
{
	int n = 0;

	for (struct op *o = ops; o; o = o->next) {
		uintptr_t d = (uintptr_t)o->dst, s = (uintptr_t)o->src;
		bool hit = (d < addr + size && d + o->n > addr) ||
			   (o->op == DBL_COPY && s < addr + size && s + o->n > addr);

		if (hit) {
			o->faulted = true;
			n++;
		}
	}
	return n;
}

static void unmap_check(const char *fn, uintptr_t addr, size_t size)
{
	int n = pending_on(addr, size);

	if (n)
		dbl_report("violation: %s of [%#" PRIxPTR ", +%zu) with %d queued operation%s "
			   "touching it (it will fault: synchronize before unmapping)",
			   fn, addr, size, n, n == 1 ? "" : "s");
}

enum dbl_err dbl_reserve(size_t size, size_t align, uintptr_t *ret)
{
	size_t a = align ? align : 2u << 20;
	uintptr_t start;
	uint8_t *p;

	if (size == 0 || (a & (a - 1)))
		return DBL_INVALID_VALUE;
	p = mmap(NULL, size + a, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
	if (p == MAP_FAILED)
		return DBL_OUT_OF_MEMORY;
	start = ((uintptr_t)p + a - 1) & ~(uintptr_t)(a - 1);
	if (start > (uintptr_t)p)
		munmap(p, start - (uintptr_t)p);
	if ((uintptr_t)p + size + a > start + size)
		munmap((void *)(start + size), (uintptr_t)p + size + a - (start + size));
	if (!map_add(&reservations, start, size, DBL_MAP_RESERVED, NULL)) {
		munmap((void *)start, size);
		return DBL_OUT_OF_MEMORY;
	}
	*ret = start;
	return DBL_OK;
}

enum dbl_err dbl_map_vmm(uintptr_t addr, size_t size, size_t offset, struct dbl_alloc *a)
{
	bool inside = false;

	for (struct dbl_map *r = reservations; r; r = r->next)
		inside |= addr >= r->addr && addr - r->addr < r->size &&
			  size <= r->size - (addr - r->addr);
	if (!inside || size == 0 || offset > a->size || size > a->size - offset)
		return DBL_INVALID_VALUE;
	for (struct dbl_map *m = maps; m; m = m->next)
		if (addr < m->addr + m->size && addr + size > m->addr)
			return DBL_ALREADY_MAPPED;
	if (mmap((void *)addr, size, PROT_NONE, MAP_SHARED | MAP_FIXED, a->fd, (off_t)offset) ==
	    MAP_FAILED)
		return DBL_OUT_OF_MEMORY;
	if (!map_add(&maps, addr, size, DBL_MAP_VMM, a))
		return DBL_OUT_OF_MEMORY;
	a->refs++;
	return DBL_OK;
}

enum dbl_err dbl_unmap_vmm(uintptr_t addr, size_t size)
{
	struct dbl_map *m = dbl_map_at(addr);
	struct dbl_alloc *a;

	if (!m || m->kind != DBL_MAP_VMM || m->size != size)
		return DBL_INVALID_VALUE;
	unmap_check("cuMemUnmap", addr, size);
	mmap((void *)addr, size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED | MAP_NORESERVE,
	     -1, 0);
	a = m->alloc;
	map_del(&maps, m);
	dbl_alloc_unref(a);
	return DBL_OK;
}

enum dbl_err dbl_reserve_free(uintptr_t addr, size_t size)
{
	struct dbl_map *r = NULL;

	for (struct dbl_map *x = reservations; x; x = x->next)
		if (x->addr == addr && x->size == size)
			r = x;
	if (!r)
		return DBL_INVALID_VALUE;
	for (struct dbl_map *m = maps; m; m = m->next)
		if (m->addr >= addr && m->addr < addr + size)
			return DBL_INVALID_VALUE; /* still mapped: unmap first */
	munmap((void *)addr, size);
	map_del(&reservations, r);
	return DBL_OK;
}

enum dbl_err dbl_set_access(uintptr_t addr, size_t size, int physical, enum dbl_access acc)
{
	struct dbl_map *m = dbl_map_find(addr, size);

	if (!m || m->kind != DBL_MAP_VMM || physical < 0)
		return DBL_INVALID_VALUE;
	if (acc == DBL_READ && no_prot_read)
		return DBL_NOT_SUPPORTED;
	if (!dbl_peer(m->alloc->dev, physical))
		return DBL_INVALID_DEVICE;
	m->access[physical] = (uint8_t)acc;
	mirror_protection(m);
	return DBL_OK;
}

enum dbl_err dbl_free_own(uintptr_t addr, const char *fn)
{
	struct dbl_map *m = dbl_map_at(addr);
	struct dbl_alloc *a;
	uint32_t who;

	if (!m || m->kind != DBL_MAP_OWN)
		return DBL_INVALID_VALUE;
	a = m->alloc;
	who = other_holder(a->id);
	if (who)
		dbl_report("violation: %s of allocation %" PRIu64 " (%zu bytes) while pid %u "
			   "still has it open through IPC",
			   fn, a->id, a->size, who);
	unmap_check(fn, addr, m->size);
	munmap((void *)addr, m->size);
	map_del(&maps, m);
	dbl_alloc_unref(a);
	return DBL_OK;
}

enum dbl_err dbl_ipc_get(uintptr_t addr, struct dbl_ipc_handle *h)
{
	struct dbl_map *m = dbl_map_find(addr, 1);

	if (!m || m->kind != DBL_MAP_OWN)
		return DBL_INVALID_VALUE;
	memset(h, 0, sizeof(*h));
	memcpy(h->magic, "tdgpuipc", 8);
	h->pid = (uint32_t)getpid();
	h->fd = m->alloc->fd;
	h->id = m->alloc->id;
	h->size = m->alloc->size;
	h->dev = m->alloc->dev;
	return DBL_OK;
}

enum dbl_err dbl_ipc_open(const struct dbl_ipc_handle *h, uintptr_t *ret)
{
	char path[64];
	struct dbl_alloc *a;
	struct dbl_map *m;
	uint64_t id;
	size_t size;
	int fd, dev;
	void *p;

	if (memcmp(h->magic, "tdgpuipc", 8) != 0 || h->pid == (uint32_t)getpid())
		return DBL_INVALID_VALUE;
	for (m = maps; m; m = m->next)
		if (m->kind == DBL_MAP_IPC && m->alloc->id == h->id) {
			m->refs++;
			*ret = m->addr;
			return DBL_OK;
		}
	/* The exporter's descriptor, as the driver reaches the exporter's memory. */
	snprintf(path, sizeof(path), "/proc/%u/fd/%d", h->pid, h->fd);
	fd = open(path, O_RDWR | O_CLOEXEC);
	if (fd < 0)
		return DBL_INVALID_HANDLE;
	if (!memfd_identity(fd, &id, &dev, &size) || id != h->id || size != h->size) {
		close(fd);
		return DBL_INVALID_HANDLE;
	}
	p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	if (p == MAP_FAILED || !(a = alloc_add(id, fd, size, dev))) {
		if (p != MAP_FAILED)
			munmap(p, size);
		close(fd);
		return DBL_OUT_OF_MEMORY;
	}
	acct_add(REC_IMPORTER, dev, id, size);
	if (!(m = map_add(&maps, (uintptr_t)p, size, DBL_MAP_IPC, a))) {
		munmap(p, size);
		dbl_alloc_unref(a);
		return DBL_OUT_OF_MEMORY;
	}
	for (int d = 0; d < ndev; d++)
		m->access[d] = dbl_peer(dev, d) ? DBL_RW : DBL_NONE;
	*ret = m->addr;
	return DBL_OK;
}

enum dbl_err dbl_ipc_close(uintptr_t addr, const char *fn)
{
	struct dbl_map *m = dbl_map_at(addr);
	struct dbl_alloc *a;

	if (!m || m->kind != DBL_MAP_IPC)
		return DBL_INVALID_VALUE;
	if (--m->refs > 0)
		return DBL_OK;
	unmap_check(fn, addr, m->size);
	munmap((void *)addr, m->size);
	a = m->alloc;
	map_del(&maps, m);
	dbl_alloc_unref(a);
	return DBL_OK;
}

/* ---- device work ------------------------------------------------------------ */

static enum dbl_err fault(const char *what, const void *p, size_t n)
{
	dbl_report("fault: %s at %p (+%zu): illegal address; the process's device state is "
		   "lost (sticky)",
		   what, p, n);
	poison = DBL_ILLEGAL_ADDRESS;
	return poison;
}

/*
 * May device dev touch [p, p + n) (write: change it)? Host memory outside
 * what the double handed out passes (unified addressing).
 */
static enum dbl_err may_touch(int dev, const void *p, size_t n, bool write, bool is_kernel)
{
	struct dbl_map *m = dbl_map_find((uintptr_t)p, n);
	uint8_t need = write ? DBL_RW : DBL_READ;

	if (n == 0)
		return DBL_OK;
	if (!m)
		return in_device_space((uintptr_t)p) ? fault(write ? "write" : "read", p, n)
						     : DBL_OK;
	if ((m->access[dev] & need) == need)
		return DBL_OK;
	if (m->access[dev] == DBL_READ && !is_kernel)
		return DBL_INVALID_VALUE; /* the copy engine refuses a read-only target */
	return fault(write ? "write to memory mapped without write access"
			   : "read of memory mapped without access",
		     p, n);
}

static enum dbl_err run(int dev, enum dbl_op op, void *dst, const void *src, int value, size_t n,
			bool is_kernel)
{
	enum dbl_err e = may_touch(dev, dst, n, true, is_kernel || op == DBL_SET);

	if (e == DBL_OK && op == DBL_COPY)
		e = may_touch(dev, src, n, false, is_kernel);
	if (e != DBL_OK)
		return e;
	if (op == DBL_COPY)
		memmove(dst, src, n);
	else
		memset(dst, value, n);
	return DBL_OK;
}

enum dbl_err dbl_sync(uintptr_t stream, bool all)
{
	struct op **p = &ops;

	while (*p) {
		struct op *o = *p;
		enum dbl_err e;

		if (!all && o->stream != stream) {
			p = &o->next;
			continue;
		}
		*p = o->next;
		if (o->faulted)
			e = fault("queued work on memory unmapped before it ran", o->dst, o->n);
		else if (poison)
			e = poison;
		else
			e = run(o->dev, o->op, o->dst, o->src, o->value, o->n, true);
		free(o);
		if (e != DBL_OK)
			poison = poison ? poison : e;
	}
	ops_tail = &ops;
	while (*ops_tail)
		ops_tail = &(*ops_tail)->next;
	return poison;
}

enum dbl_err dbl_copy(int dev, void *dst, const void *src, size_t n, bool is_kernel)
{
	enum dbl_err e = dbl_sync(0, true);

	return e != DBL_OK ? e : run(dev, DBL_COPY, dst, src, 0, n, is_kernel);
}

enum dbl_err dbl_set(int dev, void *dst, int value, size_t n)
{
	enum dbl_err e = dbl_sync(0, true);

	return e != DBL_OK ? e : run(dev, DBL_SET, dst, NULL, value, n, true);
}

/*
 * DBL_INVALID_VALUE when [p, p + n) lies in memory device dev maps read-only:
 * what CUDA's memset answers at once (seen on an H200, driver 580), leaving
 * the context usable, where a kernel's write would fault.
 */
enum dbl_err dbl_refuse_read_only(int dev, const void *p, size_t n)
{
	struct dbl_map *m = n ? dbl_map_find((uintptr_t)p, n) : NULL;

	return m && m->access[dev] == DBL_READ ? DBL_INVALID_VALUE : DBL_OK;
}

enum dbl_err dbl_enqueue(int dev, uintptr_t stream, enum dbl_op op, void *dst, const void *src,
			 int value, size_t n)
{
	struct op *o = calloc(1, sizeof(*o));

	if (!o)
		return DBL_OUT_OF_MEMORY;
	*o = (struct op){ dev, stream, op, dst, src, value, n, false, NULL };
	*ops_tail = o;
	ops_tail = &o->next;
	return DBL_OK;
}

/* ---- at exit ------------------------------------------------------------------ */

void dbl_leak_report(const char *fn_vendor)
{
	int nalloc = 0, nmap = 0, nres = 0, nops = 0, nctx = 0;
	uint64_t bytes = 0;

	if (!leaks || forked || !inited)
		return;
	for (struct dbl_alloc *a = allocs; a; a = a->next, nalloc++)
		bytes += a->size;
	for (struct dbl_map *m = maps; m; m = m->next)
		nmap++;
	for (struct dbl_map *m = reservations; m; m = m->next)
		nres++;
	for (struct op *o = ops; o; o = o->next)
		nops++;
	for (int d = 0; d < DBL_MAX_DEV; d++)
		nctx += ctx_held[d];
	if (nalloc || nmap || nres || nops || nctx)
		dbl_report("leak at exit (%s): %d allocation%s (%" PRIu64 " bytes), %d mapping%s, "
			   "%d reservation%s, %d context reference%s, %d queued operation%s",
			   fn_vendor, nalloc, nalloc == 1 ? "" : "s", bytes, nmap,
			   nmap == 1 ? "" : "s", nres, nres == 1 ? "" : "s", nctx,
			   nctx == 1 ? "" : "s", nops, nops == 1 ? "" : "s");
}
