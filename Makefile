# tensord: plain, non-recursive make. Everything lands under $(B)/.
#
#   make            build daemon, library, tensorctl, Python extension
#   make run        install what is missing, build, start the daemon, show a round trip
#   make test       install what is missing, build, run every test (also under ASan/UBSan)
#                   (Python packages go into the project's virtual environment .venv/)
#   make bench      the benchmarks next to their peers; also drawn as charts,
#                   $(B)/bench/plots/index.html
#   make fuzz       libFuzzer run over the frame and message decoders (clang), then the
#                   request-sequence fuzzer against the ASan daemon (FUZZ_TIME=60 s each)
#   make fuzz-smoke the libFuzzer target over its corpus and 5 s more (part of make test)
#   make install PREFIX=/usr/local [DESTDIR=/stage] [PYTHON_INSTALL=1]; make uninstall (same args)
#
# Knobs: SANITIZE=1 (ASan+UBSan build, use with B=build-asan), V=1 (echo commands), WERROR=,
#        CUDA_HOME=/usr/local/cuda (toolkit headers; optional).
#
# Where things are (docs/design.md has the longer map):
#   proto/            wire schema and frame codec
#   common/           descriptors, names, errors, socket path
#   gpu/              the GPU vendors, one folder each (gpu/cuda/, gpu/hip/)
#   daemon/           tensord
#   client/lib/       libtensord          client/tensorctl/  tensorctl
#   client/python/    the Python package  tests/unit/        one binary per module

B       ?= build
PREFIX  ?= /usr/local
# The project's virtual environment (.venv/, made by deploy/setup.sh for
# `make run` and `make test`: a distribution's python3 refuses pip, PEP 668);
# plain python3 until it exists, so `make` alone needs none.
VENV    ?= .venv
PYTHON  ?= $(if $(wildcard $(VENV)/bin/python),$(VENV)/bin/python,python3)
# The one version string: tensord --version, tensorctl --version, tensord.pc.
VERSION := $(shell cat VERSION)
# The library's ABI: bumped when a public struct changes (tensord_info grew in 1).
SOVER   := 2
PKGS    := libuv libprotobuf-c

ifeq ($(V),1)
Q :=
else
Q := @
endif

# Sources include each other by path from the root ("common/desc.h"); the
# generated protobuf-c header is found as "proto/tensord.pb-c.h" under $(B).
CPPFLAGS += -Iinclude -I. -I$(B) -D_GNU_SOURCE -DTENSORD_VERSION='"$(VERSION)"'
CFLAGS   ?= -O2 -g
# WERROR= (empty) keeps warnings as warnings: for a compiler newer than ours
# (tests/gpu/run.sh retries with it on a lent machine and says so).
WERROR   ?= -Werror
CFLAGS   += -std=c11 -Wall -Wextra $(WERROR) -Wshadow -Wno-unused-parameter -fvisibility=hidden -fPIC \
            $(shell pkg-config --cflags $(PKGS) 2>/dev/null)
LDLIBS   += $(shell pkg-config --libs $(PKGS) 2>/dev/null) -ldl -lpthread

ifeq ($(SANITIZE),1)
CFLAGS  += -fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined
LDFLAGS += -fsanitize=address,undefined
endif

# The CUDA toolkit's headers are used when present; the code builds without them.
CUDA_HOME ?= $(firstword $(wildcard /usr/local/cuda /usr/local/cuda-*))
ifneq ($(wildcard $(CUDA_HOME)/include/cuda.h),)
CPPFLAGS += -DTENSORD_HAVE_CUDA_H -isystem $(CUDA_HOME)/include
endif
ifneq ($(wildcard /usr/include/hip/hip_runtime_api.h),)
CPPFLAGS += -DTENSORD_HAVE_HIP_H -D__HIP_PLATFORM_AMD__
endif

PB_OBJ  := $(B)/proto/tensord.pb-c.o
obj      = $(patsubst %.c,$(B)/%.o,$(1))

# libtensord: one list (its lines may be patterns), shared with client/python/setup.py.
LIB_SRC := $(wildcard $(filter %.c,$(shell cat client/lib/sources.txt)))
LIB_OBJ := $(call obj,$(LIB_SRC)) $(PB_OBJ)

# The GPU vendors, a folder each (gpu/<id>/): its shim (<id>_api.c) goes into
# both sides, its importers (import_*.c) into libtensord, the rest into the
# daemon; gpu/*.c is what the vendors share. No vendor is named here.
GPU_API_SRC := $(wildcard gpu/*.c gpu/*/*_api.c)
GPU_IMP_SRC := $(wildcard gpu/*/import_*.c)
GPU_DMN_SRC := $(filter-out $(GPU_API_SRC) $(GPU_IMP_SRC),$(wildcard gpu/*/*.c))

# What both sides share, and the daemon.
COMMON_OBJ := $(call obj,common/desc.c common/names.c common/errors.c common/paths.c common/sys.c \
                          common/vendor.c \
                          proto/frame.c)
GPU_OBJ    := $(call obj,$(GPU_API_SRC))
# Peering with other nodes (docs/remote.md: daemon/remote/peer*.c) has a wire
# schema of its own (proto/peer.proto) and needs libcrypto (the HMAC of
# peer_auth.c); the daemon calls libcrypto only when peering is on.
PEER_PB_OBJ := $(B)/proto/peer.pb-c.o
# UCX (libucp: docs/remote.md), found with pkg-config ('ucx'; Debian's
# libucx-dev, which deploy/setup.sh installs). Where it is missing the
# daemon links the data path's stub (daemon/remote/xport/none.c: remote attach
# answers why) and bench/ucx_get is left out.
UCX_PKG := ucx
UCX_OK  := $(shell pkg-config --exists $(UCX_PKG) 2>/dev/null && echo 1)
XPORT_SRC := $(if $(UCX_OK),daemon/remote/xport/ucx.c,daemon/remote/xport/none.c)
UCX_LIBS  := $(if $(UCX_OK),$(shell pkg-config --libs $(UCX_PKG)))
CRYPTO_LIBS := $(shell pkg-config --libs libcrypto 2>/dev/null || echo -lcrypto)
# The daemon's state log checks each record with zlib's CRC-32 (daemon/persist/record.c).
ZLIB_LIBS := $(shell pkg-config --libs zlib 2>/dev/null || echo -lz)
DMN_OBJ    := $(call obj,$(wildcard daemon/*.c daemon/*/*.c) $(GPU_DMN_SRC) $(XPORT_SRC)) \
              $(COMMON_OBJ) $(GPU_OBJ) $(PB_OBJ) $(PEER_PB_OBJ)

CTL_OBJ := $(call obj,$(wildcard client/tensorctl/*.c))
# libtensord reads and writes checkpoints (client/lib/file_*.c): .npz with
# libzip, .safetensors's header with jansson. A program that links the
# static library and calls neither tensord_put_file() nor tensord_get_file()
# needs neither.
CTL_PKGS := libzip jansson
CTL_LIBS := $(shell pkg-config --libs $(CTL_PKGS) 2>/dev/null)
$(CTL_OBJ) $(LIB_OBJ): CFLAGS += $(shell pkg-config --cflags $(CTL_PKGS) 2>/dev/null)

PY_SUFFIX := $(shell $(PYTHON) -c 'import sysconfig; print(sysconfig.get_config_var("EXT_SUFFIX"))' 2>/dev/null)
PY_INC    := $(shell $(PYTHON) -c 'import sysconfig; print(sysconfig.get_paths()["include"])' 2>/dev/null)
PY_DIR    := $(B)/python/tensord
PY_EXT    := $(PY_DIR)/_tensord$(PY_SUFFIX)
PY_FILES  := $(patsubst client/python/tensord/%,$(PY_DIR)/%,$(wildcard client/python/tensord/*.py client/python/tensord/*.pyi client/python/tensord/py.typed))

UNIT_SRC  := $(wildcard tests/unit/test_*.c)
UNIT_BIN  := $(UNIT_SRC:tests/unit/%.c=$(B)/tests/unit/%)
HELP_SRC  := $(wildcard tests/integration/*.c)
HELP_BIN  := $(HELP_SRC:tests/integration/%.c=$(B)/tests/helpers/%)
# The daemon over the unit tests' fake GPU driver (tests/fakegpu/).
FAKEGPU_BIN := $(B)/tests/helpers/tensord-fakegpu
# The GPU driver double (tests/gpudouble/, docs/gpu.md): a libcuda.so.1,
# libnvidia-ml.so.1 and libamdhip64.so.6 that move real memory between
# processes, selected with LD_LIBRARY_PATH=$(DBL_DIR). Always plain flags:
# sanitized and plain programs alike load them.
DBL_DIR  := $(B)/gpudouble
DBL_LIBS := $(DBL_DIR)/libcuda.so.1 $(DBL_DIR)/libnvidia-ml.so.1 $(DBL_DIR)/libamdhip64.so.6
DBL_CFLAGS := -std=c11 -O2 -g -Wall -Wextra $(WERROR) -Wshadow -fPIC -fvisibility=hidden -I. \
              -D_GNU_SOURCE
# The hardware suite (tests/gpu/gpu_suite.c, a CUDA program: needs cuda.h),
# linked against the double here; tests/gpu/run.sh links it with the real driver.
ifneq ($(wildcard $(CUDA_HOME)/include/cuda.h),)
GPU_SUITE := $(B)/tests/gpu/gpu_suite
endif
# Where UCX is missing, bench/ucx_get (the GET baseline) is left out too.
UCX_MISSING := UCX not found (pkg-config $(UCX_PKG): no $(UCX_PKG).pc; Debian: libucx-dev, which \
               deploy/setup.sh installs)
UCX_BENCH_SRC := $(wildcard bench/ucx_get.c)
BENCH_SRC := $(filter-out $(UCX_BENCH_SRC),$(wildcard bench/*.c))
BENCH_BIN := $(BENCH_SRC:bench/%.c=$(B)/bench/%)
ifeq ($(UCX_OK),1)
UCX_BENCH_BIN := $(UCX_BENCH_SRC:bench/%.c=$(B)/bench/%)
endif

.PHONY: all setup run test test-unit test-integration test-python test-asan test-tsan bench bench-run fuzz \
        fuzz-smoke \
        install uninstall clean format format-check ucx-note

all: $(B)/tensord $(B)/tensorctl $(B)/libtensord.so $(B)/libtensord.a $(B)/tensord.pc \
     $(PY_EXT) $(PY_FILES) $(HELP_BIN) $(FAKEGPU_BIN) $(BENCH_BIN) $(UCX_BENCH_BIN) $(DBL_LIBS) \
     $(GPU_SUITE) $(if $(UCX_OK),,ucx-note)

# Said once per `make` where UCX is missing; nothing else of the build needs it.
ucx-note:
	@echo "note: $(UCX_MISSING): $(UCX_BENCH_SRC) is not built"

setup:
	$(Q)VENV=$(VENV) bash deploy/setup.sh test

# --- generated protobuf-c code ---------------------------------------------
$(B)/proto/tensord.pb-c.c $(B)/proto/tensord.pb-c.h: proto/tensord.proto
	@mkdir -p $(@D)
	$(Q)protoc-c --proto_path=proto --c_out=$(B)/proto $<

$(PB_OBJ): $(B)/proto/tensord.pb-c.c
	$(Q)$(CC) $(CPPFLAGS) $(CFLAGS) -Wno-shadow -c $< -o $@

$(B)/proto/peer.pb-c.c $(B)/proto/peer.pb-c.h: proto/peer.proto
	@mkdir -p $(@D)
	$(Q)protoc-c --proto_path=proto --c_out=$(B)/proto $<

$(PEER_PB_OBJ): $(B)/proto/peer.pb-c.c
	$(Q)$(CC) $(CPPFLAGS) $(CFLAGS) -Wno-shadow -c $< -o $@

# Every object waits for both generated headers (the generic rule below):
# a daemon or library file may include either.

$(B)/%.o: %.c $(B)/proto/tensord.pb-c.h $(B)/proto/peer.pb-c.h $(B)/.flags
	@mkdir -p $(@D)
	@echo "  CC  $<"
	$(Q)$(CC) $(CPPFLAGS) $(CFLAGS) -MMD -MP -c $< -o $@

# Rebuild everything when the flags change (Redis does the same).
$(B)/.flags: FORCE
	@mkdir -p $(B)
	@echo '$(CC) $(CPPFLAGS) $(CFLAGS) $(LDFLAGS)' | cmp -s - $@ || echo '$(CC) $(CPPFLAGS) $(CFLAGS) $(LDFLAGS)' > $@
FORCE:

# --- binaries and libraries -------------------------------------------------
$(B)/tensord: $(DMN_OBJ)
	@echo "  LD  $@"
	$(Q)$(CC) $(LDFLAGS) -o $@ $^ $(LDLIBS) $(CRYPTO_LIBS) $(UCX_LIBS) $(ZLIB_LIBS)

$(B)/daemon/main-fakegpu.o: daemon/main.c $(B)/proto/tensord.pb-c.h $(B)/.flags
	@mkdir -p $(@D)
	$(Q)$(CC) $(CPPFLAGS) $(CFLAGS) -MMD -MP -Dmain=tensord_main -c $< -o $@

$(FAKEGPU_BIN): tests/fakegpu/tensord_fakegpu.c $(B)/daemon/main-fakegpu.o \
		$(filter-out $(B)/daemon/main.o,$(DMN_OBJ))
	@mkdir -p $(@D)
	@echo "  LD  $@"
	$(Q)$(CC) $(CPPFLAGS) $(CFLAGS) $(LDFLAGS) -o $@ $^ $(LDLIBS) $(CRYPTO_LIBS) $(UCX_LIBS) $(ZLIB_LIBS)

DBL_CORE := tests/gpudouble/core.c tests/gpudouble/double.h gpu/cuda/cuda_api.h gpu/cuda/nvml.h \
            gpu/hip/hip_api.h
$(DBL_DIR)/libcuda.so.1: tests/gpudouble/cuda.c $(DBL_CORE)
$(DBL_DIR)/libnvidia-ml.so.1: tests/gpudouble/nvml.c $(DBL_CORE)
$(DBL_DIR)/libamdhip64.so.6: tests/gpudouble/hip.c $(DBL_CORE)
$(DBL_LIBS):
	@mkdir -p $(@D)
	@echo "  LD  $@"
	$(Q)$(CC) $(DBL_CFLAGS) -shared -Wl,-soname,$(@F) -o $@ $(filter %.c,$^) -lpthread

$(GPU_SUITE): tests/gpu/gpu_suite.c $(B)/libtensord.a $(DBL_DIR)/libcuda.so.1
	@mkdir -p $(@D)
	@echo "  LD  $@"
	$(Q)$(CC) $(CPPFLAGS) $(CFLAGS) $(LDFLAGS) -o $@ $< $(B)/libtensord.a \
		-L$(DBL_DIR) -l:libcuda.so.1 $(LDLIBS)

$(B)/libtensord.a: $(LIB_OBJ)
	$(Q)rm -f $@ && ar rcs $@ $^

$(B)/libtensord.so: $(LIB_OBJ)
	@echo "  LD  $@"
	$(Q)$(CC) $(LDFLAGS) -shared -Wl,-soname,libtensord.so.$(SOVER) -o $@ $^ $(LDLIBS) $(CTL_LIBS)

$(B)/tensorctl: $(CTL_OBJ) $(B)/libtensord.a
	@echo "  LD  $@"
	$(Q)$(CC) $(LDFLAGS) -o $@ $^ $(LDLIBS) $(CTL_LIBS)

$(B)/tensord.pc: deploy/tensord.pc.in VERSION
	$(Q)sed -e 's|@PREFIX@|$(PREFIX)|g; s|@VERSION@|$(VERSION)|g' $< > $@

# The Python extension links the static library; it never links libpython.
$(PY_EXT): $(wildcard client/python/*.c client/python/*.h) $(B)/libtensord.a
	@mkdir -p $(@D)
	@echo "  PY  $@"
	$(Q)$(CC) $(CPPFLAGS) -I$(PY_INC) $(CFLAGS) -Wno-cast-function-type -shared -o $@ \
		$(wildcard client/python/*.c) $(B)/libtensord.a $(LDFLAGS) $(LDLIBS) $(CTL_LIBS)

$(PY_DIR)/%: client/python/tensord/%
	@mkdir -p $(@D)
	$(Q)cp $< $@

# --- tests --------------------------------------------------------------------
# Each unit test links its module and what that module needs, nothing more:
# the list below is the module's dependency graph, checked by the linker.
UNIT_DEPS_test_frame       := proto/frame.c
UNIT_DEPS_test_desc        := common/desc.c common/names.c common/errors.c common/vendor.c
UNIT_DEPS_test_gpu_vendor  := common/vendor.c common/names.c common/desc.c common/errors.c
UNIT_DEPS_test_pool        := daemon/memory/pool.c daemon/base/log.c common/paths.c
UNIT_DEPS_test_slab        := daemon/memory/slab.c common/sys.c
UNIT_DEPS_test_record      := daemon/persist/record.c
UNIT_DEPS_test_seqs        := daemon/persist/seqs.c
$(B)/tests/unit/test_record: LDLIBS += $(ZLIB_LIBS)
UNIT_DEPS_test_sys         := common/sys.c
UNIT_DEPS_test_memlimit    := daemon/memory/memlimit.c
UNIT_DEPS_test_ratelimit   := daemon/base/ratelimit.c daemon/base/log.c common/paths.c
UNIT_DEPS_test_paths       := common/paths.c
UNIT_DEPS_test_options     := daemon/options.c daemon/options_value.c daemon/options_peer.c \
                              daemon/config.c daemon/base/log.c common/paths.c \
                              daemon/remote/peer_auth.c common/desc.c common/names.c common/vendor.c
$(B)/tests/unit/test_options: LDLIBS += $(CRYPTO_LIBS)
$(B)/daemon/remote/xport/ucx.o: CFLAGS += $(shell pkg-config --cflags $(UCX_PKG) 2>/dev/null)
UNIT_DEPS_test_config      := daemon/config.c common/paths.c
UNIT_DEPS_test_log         := daemon/base/log.c common/paths.c
# A daemon module may count a figure (figure_count()): its test links metrics.c, the counters' home.
UNIT_DEPS_test_registry    := daemon/registry/registry.c daemon/registry/registry_lease.c \
                              daemon/registry/registry_create.c daemon/registry/registry_reserve.c \
                              daemon/registry/registry_ring.c daemon/registry/registry_arena.c \
                              daemon/registry/registry_bind.c daemon/registry/registry_readopt.c \
                              daemon/registry/commit.c daemon/registry/txn.c \
                              daemon/base/quota.c daemon/memory/backend_host.c daemon/memory/pool.c \
                              daemon/memory/release_hook.c daemon/metrics.c \
                              daemon/memory/slab.c \
                              daemon/memory/memlimit.c common/sys.c \
                              daemon/base/log.c common/paths.c common/desc.c \
                              common/names.c common/errors.c common/vendor.c
UNIT_DEPS_test_registry_async := $(UNIT_DEPS_test_registry)
UNIT_DEPS_test_versions    := $(UNIT_DEPS_test_registry)
UNIT_DEPS_test_quarantine  := $(UNIT_DEPS_test_registry) daemon/quarantine.c
UNIT_DEPS_test_reserve     := $(UNIT_DEPS_test_registry)
UNIT_DEPS_test_ring        := $(UNIT_DEPS_test_registry)
UNIT_DEPS_test_readopt     := $(UNIT_DEPS_test_registry) daemon/registry/registry_restore.c
UNIT_DEPS_test_figures     := daemon/figures.c daemon/metrics.c daemon/base/quota.c daemon/memory/backend_host.c \
                              daemon/memory/release_hook.c \
                              daemon/memory/pool.c daemon/memory/slab.c daemon/memory/memlimit.c daemon/base/log.c \
                              common/sys.c common/paths.c common/names.c common/desc.c \
                              common/errors.c common/vendor.c \
                              proto/tensord.pb-c.c
UNIT_DEPS_test_waiters     := daemon/waiters.c daemon/metrics.c daemon/base/log.c common/paths.c
UNIT_DEPS_test_metrics_http := daemon/metrics_http.c daemon/listen.c daemon/conn.c daemon/conn_set.c \
                              daemon/base/log.c daemon/metrics.c \
                              daemon/base/ratelimit.c daemon/base/sdnotify.c daemon/base/quota.c common/paths.c \
                              proto/frame.c
UNIT_DEPS_test_quota       := daemon/base/quota.c
UNIT_DEPS_test_peer_auth   := daemon/remote/peer_auth.c
$(B)/tests/unit/test_peer_auth: LDLIBS += $(CRYPTO_LIBS)
UNIT_DEPS_test_npy         := client/lib/npy.c client/lib/npy_read.c \
                              client/lib/npy_write.c common/names.c common/desc.c \
                              common/vendor.c
UNIT_DEPS_test_gpu_util    := $(GPU_API_SRC) common/vendor.c
UNIT_DEPS_test_gpu_driver  := gpu/driver.c
UNIT_DEPS_test_backend_gpu := $(GPU_DMN_SRC) daemon/memory/backend_gpu.c daemon/base/log.c daemon/memory/gpu_worker.c \
                              daemon/memory/release_hook.c \
                              common/paths.c \
                              $(GPU_API_SRC) common/vendor.c
UNIT_DEPS_test_import_gpu  := $(GPU_IMP_SRC) client/lib/import_gpu.c client/lib/error.c client/lib/import.c \
                              $(GPU_API_SRC) common/vendor.c
UNIT_DEPS_test_client_gpu  := $(LIB_SRC) proto/tensord.pb-c.c
UNIT_DEPS_test_client_frames := $(LIB_SRC) proto/tensord.pb-c.c
# The library's whole source: its checkpoint files link libzip and jansson.
$(B)/tests/unit/test_client_gpu $(B)/tests/unit/test_client_frames: LDLIBS += $(CTL_LIBS)

.SECONDEXPANSION:
$(B)/tests/unit/%: tests/unit/%.c $$(call obj,$$(UNIT_DEPS_$$*))
	@mkdir -p $(@D)
	@echo "  LD  $@"
	$(Q)$(CC) $(CPPFLAGS) $(CFLAGS) $(LDFLAGS) -o $@ $^ $(LDLIBS) -lcmocka

$(B)/tests/helpers/%: tests/integration/%.c $(B)/libtensord.a
	@mkdir -p $(@D)
	@echo "  LD  $@"
	$(Q)$(CC) $(CPPFLAGS) $(CFLAGS) $(LDFLAGS) -o $@ $(filter-out %.h,$^) $(LDLIBS)
# The threaded stress programs share their clock and first failure (static, in a header).
$(addprefix $(B)/tests/helpers/,bind_stress ring_stress readopt_stress): tests/integration/stress.h
# tdclient calls tensord_put_file() and tensord_get_file_fd() too.
$(B)/tests/helpers/tdclient: LDLIBS += $(CTL_LIBS)

$(B)/bench/%: bench/%.c $(B)/libtensord.a
	@mkdir -p $(@D)
	$(Q)$(CC) $(CPPFLAGS) $(CFLAGS) $(LDFLAGS) -o $@ $^ $(LDLIBS)

# The UCX GET baseline links UCX only (no libtensord): it is what remote
# attach is compared with.
$(UCX_BENCH_BIN): $(B)/bench/%: bench/%.c $(B)/.flags
	@mkdir -p $(@D)
	@echo "  LD  $@"
	$(Q)$(CC) $(CPPFLAGS) $(CFLAGS) $(shell pkg-config --cflags $(UCX_PKG)) $(LDFLAGS) -o $@ $< \
		$(shell pkg-config --libs $(UCX_PKG))

test: setup
	$(Q)$(MAKE) --no-print-directory format-check
	$(Q)$(MAKE) --no-print-directory all
	$(Q)$(MAKE) --no-print-directory test-unit test-integration test-python
	$(Q)$(MAKE) --no-print-directory test-asan
	$(Q)$(MAKE) --no-print-directory fuzz-smoke
	$(Q)$(MAKE) --no-print-directory test-tsan

test-unit: $(UNIT_BIN)
	$(Q)set -e; for t in $(UNIT_BIN); do echo "== $$t"; $$t; done

# pytest exits 5 when it collected nothing. For a whole suite or a named
# selection of it that is a failure (a broken import, a -k that matches
# nothing any more); only a GPU-only selection (PYTEST_GPU) may legitimately
# collect nothing, on a machine without one.
PYTEST     = $(PYTHON) -m pytest
PYTEST_GPU = sh -c '$(PYTHON) -m pytest "$$@"; rc=$$?; [ $$rc -eq 5 ] && rc=0; exit $$rc' pytest

test-integration: all
	$(Q)TENSORD_BUILD=$(abspath $(B)) $(PYTEST) -q -rs tests/integration

test-python: all
	$(Q)TENSORD_BUILD=$(abspath $(B)) PYTHONPATH=$(abspath $(B))/python \
		$(PYTEST) -q -rs tests/python

# The C suites again with AddressSanitizer and UBSan, in their own build tree.
test-asan:
	$(Q)$(MAKE) --no-print-directory B=build-asan SANITIZE=1 \
		build-asan/tensord build-asan/tensorctl \
		$(subst $(B)/,build-asan/,$(UNIT_BIN) $(HELP_BIN) $(FAKEGPU_BIN) $(DBL_LIBS) $(GPU_SUITE))
	$(Q)set -e; for t in $(subst $(B)/,build-asan/,$(UNIT_BIN)); do echo "== $$t"; $$t; done
	$(Q)ASAN_OPTIONS=detect_leaks=1 TENSORD_BUILD=$(abspath build-asan) TENSORD_SANITIZED=1 \
		$(PYTEST) -q -rs tests/integration
	$(Q)ASAN_OPTIONS=detect_leaks=1 TENSORD_BUILD=$(abspath build-asan) TENSORD_SANITIZED=1 \
		PYTHONPATH=$(abspath $(B))/python $(PYTEST_GPU) -q -rs tests/python/test_gpu_remote.py \
		tests/python/test_restart.py tests/python/test_restart_gpu.py tests/python/test_readopt.py \
		tests/python/test_idempotent.py tests/python/test_upgrade.py -k "not rate_report"

# The threads (the GPU worker, the host pool's worker, the client's flusher)
# under ThreadSanitizer: the unit tests that run them, and the daemon over the
# fake GPU driver and the pool's integration tests. A report fails the run.
# UCX's memory hooks (libucm, loaded with the daemon's UCX transport) patch
# madvise(), which glibc calls as a thread exits, after ThreadSanitizer let
# go of the thread: every threaded daemon crashed at exit. The daemon
# registers no memory with UCX (active messages only, docs/remote.md), so
# the TSan run turns the hooks off.
TSAN_UNIT := test_backend_gpu test_client_gpu test_pool
# Remote attach's tests that move 256 MiB to 1 GiB run in the plain and
# ASan suites, not here: under TSan a gigabyte's mmap and munmap also map
# and clear its shadow, which held a daemon's loop past the peers' 3 s
# heartbeat bound in one CI run (the peers then called each other down).
TSAN_DESELECT := not big_pull_moves and not kill_b_holding and not kill_a_mid and not stops_receiving
# GPU tensors across nodes (the GPU worker's staging jobs on both daemons),
# over the driver double: the tests of at most 40 MiB.
TSAN_GPU_REMOTE := pulled_onto_the_gpu or set_in_one_commit or replaced_gpu_tensor or serving_node_killed
test-tsan:
	$(Q)$(MAKE) --no-print-directory B=build-tsan CFLAGS="-O1 -g -fsanitize=thread" \
		LDFLAGS="-fsanitize=thread" build-tsan/tensord build-tsan/tensorctl \
		build-tsan/tests/helpers/tdclient build-tsan/tests/helpers/tensord-fakegpu \
		build-tsan/tests/helpers/bind_stress build-tsan/tests/helpers/ring_stress \
		build-tsan/tests/helpers/readopt_stress \
		$(TSAN_UNIT:%=build-tsan/tests/unit/%) $(subst $(B)/,build-tsan/,$(DBL_LIBS))
	$(Q)set -e; for t in $(TSAN_UNIT); do echo "== build-tsan/tests/unit/$$t"; \
		TSAN_OPTIONS=halt_on_error=1 build-tsan/tests/unit/$$t; done
	$(Q)TSAN_OPTIONS="halt_on_error=1 exitcode=66" TENSORD_BUILD=$(abspath build-tsan) \
		UCX_MEM_MMAP_HOOK_MODE=none UCX_MEM_MALLOC_HOOKS=no \
		TENSORD_SANITIZED=1 $(PYTEST) -q -rs tests/integration/test_gpu_async.py tests/integration/test_bindings_threads.py \
		tests/integration/test_recycle_threads.py tests/integration/test_readopt_threads.py \
		tests/integration/test_pool.py tests/integration/test_peers.py tests/integration/test_remote.py \
		tests/integration/test_remote_sets.py -k "$(TSAN_DESELECT)"
	$(Q)TSAN_OPTIONS="halt_on_error=1 exitcode=66" TENSORD_BUILD=$(abspath build-tsan) \
		UCX_MEM_MMAP_HOOK_MODE=none UCX_MEM_MALLOC_HOOKS=no TENSORD_SANITIZED=1 \
		PYTHONPATH=$(abspath $(B))/python $(PYTEST_GPU) -q -rs tests/python/test_gpu_remote.py \
		-k "$(TSAN_GPU_REMOTE)"

run:
	$(Q)VENV=$(VENV) bash deploy/setup.sh run
	$(Q)$(MAKE) --no-print-directory all
	$(Q)PYTHON=$(PYTHON) bash deploy/demo.sh $(B)

# C attach latency, the UCX GET baseline over TCP loopback (bench/ucx_get.c:
# what remote attach is compared with, docs/remote.md) and remote attach
# next to it (bench/py_remote.py: two daemons peered on 127.0.0.1, and the same
# transfer through Ray between two local raylets where ray imports), then Python put and
# attach next to their peers, polling adaptive next to off under confinement
# and CPU hogs (bench/py_spin.py), then sets, versions and watches
# (bench/py_sets.py), each run both pinned to one CPU (no cross-CPU
# wake-ups) and unpinned.
# Issue 34: await put() inline and offloaded with the loop's longest stall
# (bench/py_aio.py), and Ray actor-to-actor hand-offs through tensord's
# tensor transport next to Ray's object store (bench/py_ray_transport.py).
# Issue 32 (versions at copy speed): back-to-back replace=True puts of one name
# (py_put.py --replace) and a state dict's weight sync to three readers
# (py_sets.py --sync-dict linear16), each next to its sealed (TENSORD_RECYCLE=0) twin.
# Issue 33 (outlive the daemon): bench/py_restart.py: puts with the descriptor
# store on next to off, 8 clients through a kill -9 and a stop/start, and a
# restarted daemon's exec to its first attach with 100,000 tensors and 4 GiB.
# bench prints as it goes and keeps what it printed in $(B)/bench/bench.txt, from
# which bench/plots.py draws the comparisons as SVG charts on an HTML page,
# $(B)/bench/plots/index.html (what it cannot draw, it names); its status is
# bench-run's.
bench: all
	$(Q)mkdir -p $(B)/bench; \
	{ $(MAKE) --no-print-directory bench-run; echo $$? > $(B)/bench/.status; } 2>&1 \
		| tee $(B)/bench/bench.txt; \
	$(PYTHON) bench/plots.py $(B)/bench/bench.txt $(B)/bench/plots; \
	exit $$(cat $(B)/bench/.status)

bench-run: all
	$(Q)set -e; for b in $(BENCH_BIN); do $$b; done
	$(Q)$(if $(UCX_OK),$(UCX_BENCH_BIN),echo "ucx_get: skipped: $(UCX_MISSING)")
	$(Q)$(if $(UCX_OK),TENSORD_BUILD=$(abspath $(B)) PYTHONPATH=$(abspath $(B))/python \
		$(PYTHON) bench/py_remote.py,echo "py_remote: skipped: $(UCX_MISSING)")
	$(Q)set -e; export TENSORD_BUILD=$(abspath $(B)) PYTHONPATH=$(abspath $(B))/python; \
	echo "== pinned to CPU 0"; taskset -c 0 $(PYTHON) bench/py_put.py --sizes 4K,64K,64M,1G; \
	echo "== unpinned"; $(PYTHON) bench/py_put.py; \
	echo "== back-to-back versions of one name (replace=True): recycled, sealed, np.copyto, ray.put"; \
	$(PYTHON) bench/py_put.py --replace; \
	$(PYTHON) bench/py_attach.py; \
	echo "== checkpoint files: put_file/get_file next to safetensors.numpy load_file/save_file"; \
	$(PYTHON) bench/py_files.py; \
	echo "== asyncio: await put inline next to offloaded, and the loop's longest stall"; \
	$(PYTHON) bench/py_aio.py; \
	echo "== Ray: actor to actor through tensord's tensor transport next to Ray's object store"; \
	$(PYTHON) bench/py_ray_transport.py; \
	$(PYTHON) bench/py_leases.py; \
	echo "== polling: adaptive next to off, unpinned, confined after start, in a cpuset, under CPU hogs"; \
	$(PYTHON) bench/py_spin.py --fixed; \
	$(PYTHON) bench/py_names.py; \
	echo "== sets, versions, watches: pinned to CPU 0, then unpinned"; \
	taskset -c 0 $(PYTHON) bench/py_sets.py; $(PYTHON) bench/py_sets.py; \
	echo "== weight sync of a state dict (16 x Linear(2048, 2048)): tensord, sealed, torch.mp, Ray"; \
	$(PYTHON) bench/py_sets.py --parts sync --sync-dict linear16 --pss; \
	echo "== GPU create off the loop (fake driver), pinned then unpinned"; \
	taskset -c 0 $(PYTHON) bench/py_gpu_async.py; $(PYTHON) bench/py_gpu_async.py; \
	echo "== GPU attach and put over the driver double, pinned then unpinned"; \
	export LD_LIBRARY_PATH=$(abspath $(DBL_DIR)); \
	taskset -c 0 $(PYTHON) bench/py_gpu_double.py; $(PYTHON) bench/py_gpu_double.py; \
	echo "== restart: the state's cost on puts, 8 clients through a restart, exec to the first attach"; \
	$(PYTHON) bench/py_restart.py

# libFuzzer over the frame parser, the Request/Reply/PeerFrame decoders and
# the descriptor checks (needs clang and its libFuzzer runtime, which
# deploy/setup.sh installs; nothing else: no setup, no Python packages).
# UBSan findings abort, so they count as crashes. fuzz-smoke is its short
# pass in `make test` (the committed corpus, then FUZZ_SMOKE seconds), so
# the target cannot rot unseen; `make fuzz` runs it FUZZ_TIME seconds, then
# the request-sequence fuzzer (tests/integration/reqfuzz.c) as long against
# the ASan+UBSan daemon (tests/fuzz/reqfuzz.sh; FUZZ_SEED=N fixes its seed).
# Its short run is tests/integration/test_reqfuzz.py, in both suites.
FUZZ_TIME  ?= $(or $(FUZZ_SECONDS),60)
FUZZ_SMOKE ?= 5
FUZZ_SAN := -fsanitize=address,undefined -fno-sanitize-recover=undefined
FUZZ_OBJ := $(addprefix build-fuzz/,proto/tensord.pb-c.o proto/peer.pb-c.o proto/frame.o \
              common/desc.o common/names.o common/errors.o common/vendor.o)
FUZZ_BIN := build-fuzz/fuzz_frame
$(FUZZ_BIN): tests/fuzz/fuzz_frame.c FORCE
	$(Q)$(MAKE) --no-print-directory B=build-fuzz CC=clang \
		CFLAGS="-O1 -g -fsanitize=fuzzer-no-link $(FUZZ_SAN)" $(FUZZ_OBJ)
	$(Q)clang -O1 -g -fsanitize=fuzzer $(FUZZ_SAN) $(subst -I$(B),-Ibuild-fuzz,$(CPPFLAGS)) \
		tests/fuzz/fuzz_frame.c $(FUZZ_OBJ) -o $@ $(shell pkg-config --libs libprotobuf-c)

# The state log a restarted daemon reads (docs/restart.md): its records and
# steps' entries (tests/fuzz/fuzz_state.c), seeded by a log the tests write.
FUZZ_STATE_BIN := build-fuzz/fuzz_state
$(FUZZ_STATE_BIN): tests/fuzz/fuzz_state.c daemon/persist/record.c FORCE
	@mkdir -p build-fuzz
	$(Q)clang -O1 -g -fsanitize=fuzzer $(FUZZ_SAN) -Iinclude -I. -D_GNU_SOURCE \
		tests/fuzz/fuzz_state.c daemon/persist/record.c -o $@ $(ZLIB_LIBS)

fuzz-smoke: $(FUZZ_BIN) $(FUZZ_STATE_BIN)
	$(Q)rm -rf build-fuzz/smoke && mkdir -p build-fuzz/smoke/corpus build-fuzz/smoke/state
	$(Q)$(FUZZ_BIN) -max_total_time=$(FUZZ_SMOKE) -max_len=4096 -print_final_stats=1 \
		-artifact_prefix=build-fuzz/smoke/ build-fuzz/smoke/corpus tests/fuzz/corpus
	$(Q)$(FUZZ_STATE_BIN) -max_total_time=$(FUZZ_SMOKE) -max_len=8192 -print_final_stats=1 \
		-artifact_prefix=build-fuzz/smoke/ build-fuzz/smoke/state tests/fuzz/state-corpus

fuzz: $(FUZZ_BIN) $(FUZZ_STATE_BIN)
	$(Q)mkdir -p fuzz-out/corpus && $(FUZZ_BIN) -max_total_time=$(FUZZ_TIME) \
		-max_len=4096 -artifact_prefix=fuzz-out/ fuzz-out/corpus tests/fuzz/corpus
	$(Q)mkdir -p fuzz-out/state && $(FUZZ_STATE_BIN) -max_total_time=$(FUZZ_TIME) \
		-max_len=8192 -artifact_prefix=fuzz-out/ fuzz-out/state tests/fuzz/state-corpus
	$(Q)$(MAKE) --no-print-directory B=build-asan SANITIZE=1 build-asan/tensord \
		build-asan/tests/helpers/reqfuzz
	$(Q)ASAN_OPTIONS=detect_leaks=1 bash tests/fuzz/reqfuzz.sh build-asan $(FUZZ_TIME) $(FUZZ_SEED)

# --- install / uninstall ------------------------------------------------------
# Every path follows PREFIX (default /usr/local) and DESTDIR (a staging root
# for packagers); the .pc file and the systemd units are written here from
# their .in templates, so they name the paths of this install. No installed
# binary links libtensord.so (tensorctl takes the static library), so none
# needs an rpath. PYTHON_INSTALL=1 also copies the Python package into
# PYTHONDIR (`pip install ./client/python` is the usual way).
BINDIR      ?= $(PREFIX)/bin
LIBDIR      ?= $(PREFIX)/lib
INCLUDEDIR  ?= $(PREFIX)/include
MANDIR      ?= $(PREFIX)/share/man
DOCDIR      ?= $(PREFIX)/share/doc/tensord
UNITDIR     ?= $(PREFIX)/lib/systemd/system
SYSUSERSDIR ?= $(PREFIX)/lib/sysusers.d
PYTHONDIR   ?= $(shell $(PYTHON) -c 'import sysconfig; print(sysconfig.get_path("platlib", vars={"base": "$(PREFIX)", "platbase": "$(PREFIX)"}))' 2>/dev/null)
PYTHON_INSTALL ?= 0

D := $(DESTDIR)
SUBST = sed -e 's|@PREFIX@|$(PREFIX)|g; s|@BINDIR@|$(BINDIR)|g; s|@LIBDIR@|$(LIBDIR)|g' \
            -e 's|@INCLUDEDIR@|$(INCLUDEDIR)|g; s|@DOCDIR@|$(DOCDIR)|g; s|@VERSION@|$(VERSION)|g'
MAN_PAGES := $(wildcard docs/man/*.[1-8])
DOC_FILES := README.md $(wildcard docs/*.md)
INSTALL_BUILT := $(B)/tensord $(B)/tensorctl $(B)/libtensord.so $(B)/libtensord.a
ifeq ($(PYTHON_INSTALL),1)
INSTALL_BUILT += $(PY_EXT) $(PY_FILES)
endif

install: $(INSTALL_BUILT)
	install -d $(D)$(BINDIR) $(D)$(LIBDIR)/pkgconfig $(D)$(INCLUDEDIR)/tensord $(D)$(DOCDIR) \
		$(D)$(UNITDIR) $(D)$(SYSUSERSDIR) $(addprefix $(D)$(MANDIR)/man,1 3 8)
	install -m 755 $(B)/tensord $(B)/tensorctl $(D)$(BINDIR)/
	install -m 644 $(B)/libtensord.a $(D)$(LIBDIR)/
	install -m 755 $(B)/libtensord.so $(D)$(LIBDIR)/libtensord.so.$(VERSION)
	ln -sf libtensord.so.$(VERSION) $(D)$(LIBDIR)/libtensord.so.$(SOVER)
	ln -sf libtensord.so.$(SOVER) $(D)$(LIBDIR)/libtensord.so
	install -m 644 include/tensord/tensord.h include/tensord/dlpack.h $(D)$(INCLUDEDIR)/tensord/
	$(SUBST) deploy/tensord.pc.in > $(D)$(LIBDIR)/pkgconfig/tensord.pc
	$(SUBST) deploy/systemd/tensord.service.in > $(D)$(UNITDIR)/tensord.service
	install -m 644 deploy/systemd/tensord.socket $(D)$(UNITDIR)/
	install -m 644 deploy/systemd/tensord.sysusers $(D)$(SYSUSERSDIR)/tensord.conf
	set -e; for m in $(MAN_PAGES); do install -m 644 $$m $(D)$(MANDIR)/man$${m##*.}/; done
	install -m 644 $(DOC_FILES) deploy/systemd/gpu.conf $(D)$(DOCDIR)/
ifeq ($(PYTHON_INSTALL),1)
	install -d $(D)$(PYTHONDIR)/tensord
	install -m 644 $(PY_EXT) $(PY_FILES) $(D)$(PYTHONDIR)/tensord/
endif

uninstall:
	rm -f $(addprefix $(D)$(BINDIR)/,tensord tensorctl)
	rm -f $(addprefix $(D)$(LIBDIR)/,libtensord.a libtensord.so libtensord.so.$(SOVER) \
		libtensord.so.$(VERSION) pkgconfig/tensord.pc)
	rm -f $(addprefix $(D)$(UNITDIR)/,tensord.service tensord.socket) $(D)$(SYSUSERSDIR)/tensord.conf
	rm -f $(foreach m,$(MAN_PAGES),$(D)$(MANDIR)/man$(subst .,,$(suffix $(m)))/$(notdir $(m)))
	rm -rf $(D)$(INCLUDEDIR)/tensord $(D)$(DOCDIR)
ifeq ($(PYTHON_INSTALL),1)
	rm -rf $(if $(PYTHONDIR),$(D)$(PYTHONDIR)/tensord)
endif

# Our C, laid out by .clang-format (dlpack.h is DLPack's own, kept as it is):
# every C source and header git tracks, so a new folder is never missed; out
# of a git checkout (a release tarball), the folders by pattern.
FORMAT_GIT := $(shell git ls-files -- '*.c' '*.h' 2>/dev/null)
FORMAT_SRC := $(filter-out include/tensord/dlpack.h, \
	$(if $(FORMAT_GIT),$(FORMAT_GIT), \
	$(wildcard daemon/*.[ch] daemon/*/*.[ch] daemon/*/*/*.[ch] client/*/*.[ch] common/*.[ch] \
		   gpu/*.[ch] gpu/*/*.[ch] proto/*.[ch] include/tensord/*.h tests/unit/*.[ch] \
		   tests/integration/*.c tests/python/*.c tests/gpu/*.c tests/fuzz/*.c \
		   tests/fakegpu/*.c tests/gpudouble/*.[ch] bench/*.c)))

format:
	clang-format -i $(FORMAT_SRC)

# Fails, naming the files, when any of them is not laid out as `make format` would.
format-check:
	$(Q)clang-format --dry-run -Werror $(FORMAT_SRC)

clean:
	rm -rf $(B) build-asan build-fuzz

-include $(shell find $(B) -name '*.d' 2>/dev/null)
