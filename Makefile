# reshard: see README.md. Targets: all (default), test, test-rdma, test-frameworks, demo, bench, deps,
# install, format, check-layers, clean. Knobs: DEBUG=1 (-O0 -g3), ASAN=1 (ASan + UBSan), PREFIX=/usr/local.

PREFIX ?= /usr/local
CC ?= cc

ifeq ($(ASAN),1)
BUILD ?= build/asan
SAN := -fsanitize=address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer
else ifeq ($(DEBUG),1)
BUILD ?= build/debug
else
BUILD ?= build
endif
OPT := $(if $(filter 1,$(DEBUG)),-O0 -g3,-O2 -g)

CFLAGS_ALL := -std=c11 -D_GNU_SOURCE -Wall -Wextra -Werror -fvisibility=hidden -fPIC \
              -MMD -MP $(OPT) $(SAN) -I. $(CFLAGS)
LDFLAGS_ALL := $(SAN) $(LDFLAGS)

# The library's layers, bottom up; make check-layers keeps every include pointing down them.
LAYERS := base planner cuda transport plugin
# plugin/m2n (NCCL M2N's API) is an object of its own, M2N_SO below, so the plugin exports only
# reshard's API.
LIB_SRC := $(filter-out plugin/m2n/%,$(sort $(shell find $(LAYERS) -name '*.c')))
LIB_OBJ := $(LIB_SRC:%.c=$(BUILD)/obj/%.o)
# The net plugin conformance driver, a program of its own (test/plugin/net/net_driver.h).
NET_DRIVER_SRC := test/plugin/net/net_driver.c test/plugin/net/net_table.c \
                  test/plugin/net/net_stream.c test/plugin/net/net_hostile.c \
                  test/plugin/net/net_lifecycle.c
NET_DRIVER_OBJ := $(NET_DRIVER_SRC:%.c=$(BUILD)/obj/%.o)
# Every suite under test/ except the stand-ins, fuzz targets, benchmarks and the net driver,
# which are programs of their own.
TEST_SRC := $(filter-out $(NET_DRIVER_SRC), \
              $(sort $(shell find test -name '*.c' -not -path 'test/fake/*' \
                                -not -path 'test/fuzz/*' -not -path 'test/perf/*')))
TEST_OBJ := $(TEST_SRC:%.c=$(BUILD)/obj/%.o)

SO := $(BUILD)/libnccl-net-reshard.so
# NCCL M2N's C API over reshard (plugin/m2n/nccl_m2n.h), in place of libnccl_m2n.so: the
# library whole inside it, so it too needs only libc.
M2N_SRC := $(sort $(wildcard plugin/m2n/*.c))
M2N_OBJ := $(M2N_SRC:%.c=$(BUILD)/obj/%.o)
M2N_SO := $(BUILD)/libreshard-m2n.so
AR_LIB := $(BUILD)/libreshard-internal.a
# The tools, in one place and laid out as installed: bin/ beside lib/ (a link to the library),
# each finding the library through its RUNPATH $ORIGIN/../lib, here and under any PREFIX.
PLAN_BIN := $(BUILD)/bin/reshard-plan
PERF_BIN := $(BUILD)/bin/reshard_perf
PERF_SRC := test/perf/reshard_perf.c test/perf/perf_sweep.c test/perf/perf_args.c
PERF_OBJ := $(PERF_SRC:%.c=$(BUILD)/obj/%.o)
NET_PERF_BIN := $(BUILD)/bin/reshard_net_perf
TOOL_BINS := $(PLAN_BIN) $(PERF_BIN) $(NET_PERF_BIN)
TOOL_RPATH := -Wl,-rpath,'$$ORIGIN/../lib'
LIB_LINK := $(BUILD)/lib/libnccl-net-reshard.so
# Where the tools were before build/bin: links to them, so that older commands still run.
OLD_TOOL_LINKS := $(BUILD)/reshard-plan $(BUILD)/test/perf/reshard_perf $(BUILD)/reshard_net_perf
PLAN_SRC := $(sort $(wildcard tools/*.c))
PLAN_OBJ := $(PLAN_SRC:%.c=$(BUILD)/obj/%.o)
UNIT_BIN := $(BUILD)/test/unit
BENCH_BIN := $(BUILD)/test/perf/plan_bench
NET_DRIVER := $(BUILD)/test/net_driver
NCCL_CHECK := $(BUILD)/test/perf/nccl_check
NCCL_NET_CHECK := $(BUILD)/test/perf/nccl_net_check
M2N_CHECK := $(BUILD)/test/perf/m2n_check
PACK_BENCH := $(BUILD)/test/perf/pack_bench
DEVICE_REFIT := $(BUILD)/test/perf/device_refit
BOOT_SCALE := $(BUILD)/test/perf/boot_scale
JOIN_BENCH := $(BUILD)/test/perf/join_bench
# Stand-ins for libcuda and libnccl (test/fake/), so the NCCL paths run on hosts without a GPU.
FAKE_LIBS := $(BUILD)/test/fake/libcuda.so.1 $(BUILD)/test/fake/libnccl.so.2

# Debian packages that building and testing need (make deps installs the missing ones).
DEPS := gcc make binutils pkg-config libcriterion-dev libucx-dev libibverbs-dev libjansson-dev \
        libssl3 iproute2 util-linux python3 python3-numpy python3-venv python3-setuptools \
        python3-wheel patchelf
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
# Debian's interpreter (python3-numpy is installed for it), whatever python3 a PATH prefers.
PYTHON ?= /usr/bin/python3

.PHONY: all test test-rdma test-frameworks demo bench deps install format format-check clean \
        fuzz fuzz-build check-layers

all: $(SO) $(M2N_SO) $(LIB_LINK) $(TOOL_BINS) $(OLD_TOOL_LINKS)

$(BUILD)/obj/%.o: %.c
	@mkdir -p $(@D)
	$(CC) $(CFLAGS_ALL) -c $< -o $@

# The pack kernels (cuda/pack.cu): a fatbin for sm_80, sm_90 and sm_100 plus PTX, embedded
# in the library as a C array. Without nvcc the library is built without them and says so
# when asked for device packing.
NVCC ?= $(firstword $(wildcard /usr/local/cuda/bin/nvcc) $(shell command -v nvcc 2>/dev/null))
CUDA_ARCHS := -gencode arch=compute_80,code=sm_80 -gencode arch=compute_90,code=sm_90 \
              -gencode arch=compute_100,code=[sm_100,compute_100]
ifneq ($(NVCC),)
FATBIN_OBJ := $(BUILD)/obj/cuda/pack_fatbin.o
$(BUILD)/obj/cuda/pack.fatbin: cuda/pack.cu cuda/pack_desc.h cuda/quant.h cuda/delta_desc.h
	@mkdir -p $(@D)
	$(NVCC) -fatbin $(CUDA_ARCHS) -O3 -I. -o $@ $<
$(BUILD)/obj/cuda/pack_fatbin.c: $(BUILD)/obj/cuda/pack.fatbin scripts/embed.py
	$(PYTHON) scripts/embed.py rs_pack_fatbin $< $@
$(FATBIN_OBJ): $(BUILD)/obj/cuda/pack_fatbin.c
	$(CC) -std=c11 -fPIC -c $< -o $@
endif

$(SO): $(LIB_OBJ) $(FATBIN_OBJ)
	$(CC) -shared -Wl,-soname,libnccl-net-reshard.so -Wl,--no-undefined -o $@ $^ \
	    $(LDFLAGS_ALL) -lpthread -ldl

$(M2N_SO): $(M2N_OBJ) $(AR_LIB) $(FATBIN_OBJ)
	$(CC) -shared -Wl,-soname,libreshard-m2n.so -Wl,--no-undefined -o $@ $(M2N_OBJ) \
	    $(FATBIN_OBJ) $(AR_LIB) $(LDFLAGS_ALL) -lpthread -ldl

$(AR_LIB): $(LIB_OBJ)
	@rm -f $@
	ar rcs $@ $^

$(LIB_LINK): $(SO)
	@mkdir -p $(@D)
	ln -sfn ../$(notdir $(SO)) $@

$(PLAN_BIN): $(PLAN_OBJ) $(SO) $(LIB_LINK)
	@mkdir -p $(@D)
	$(CC) -o $@ $(PLAN_OBJ) -L$(BUILD) -lnccl-net-reshard $(TOOL_RPATH) $(LDFLAGS_ALL)

# A link replaces whatever an older build left at the old path (make follows the link, so it
# is up to date as long as the tool is).
$(BUILD)/reshard-plan: $(PLAN_BIN)
	ln -sfn bin/reshard-plan $@
$(BUILD)/reshard_net_perf: $(NET_PERF_BIN)
	ln -sfn bin/reshard_net_perf $@
$(BUILD)/test/perf/reshard_perf: $(PERF_BIN)
	@mkdir -p $(@D)
	ln -sfn ../../bin/reshard_perf $@

# Unit tests see the internals through the static archive; the public API tests reach the same
# code, and the export test checks the shared object itself.
# The fatbin object goes in by name: its symbols are weak references, which do not pull a
# member out of an archive.
$(UNIT_BIN): $(TEST_OBJ) $(M2N_OBJ) $(AR_LIB) $(FATBIN_OBJ)
	@mkdir -p $(@D)
	$(CC) -o $@ $(TEST_OBJ) $(M2N_OBJ) $(FATBIN_OBJ) $(AR_LIB) -lcriterion -lpthread -ldl -lm \
	    $(LDFLAGS_ALL)

$(BENCH_BIN): $(BUILD)/obj/test/perf/plan_bench.o $(SO)
	@mkdir -p $(@D)
	$(CC) -o $@ $< -L$(BUILD) -lnccl-net-reshard -Wl,-rpath,'$$ORIGIN/../..' $(LDFLAGS_ALL)

# reshard_perf: the nccl-tests style perf tool (public API only).
$(PERF_BIN): $(PERF_OBJ) $(SO) $(LIB_LINK)
	@mkdir -p $(@D)
	$(CC) -o $@ $(PERF_OBJ) -L$(BUILD) -lnccl-net-reshard $(TOOL_RPATH) -lm $(LDFLAGS_ALL)

# pack_bench: the pack kernels against cuMemcpyDtoD (scripts/gpu-check.sh; internals).
$(PACK_BENCH): $(BUILD)/obj/test/perf/pack_bench.o $(AR_LIB) $(FATBIN_OBJ)
	@mkdir -p $(@D)
	$(CC) -o $@ $< $(FATBIN_OBJ) $(AR_LIB) -lpthread -ldl $(LDFLAGS_ALL)

# delta_dev_bench: the compare-and-compact kernels' speed on a GPU (scripts/gpu-check.sh).
DELTA_DEV_BENCH := $(BUILD)/test/perf/delta_dev_bench
$(DELTA_DEV_BENCH): $(BUILD)/obj/test/perf/delta_dev_bench.o $(AR_LIB) $(FATBIN_OBJ)
	@mkdir -p $(@D)
	$(CC) -o $@ $< $(FATBIN_OBJ) $(AR_LIB) -lpthread -ldl $(LDFLAGS_ALL)

# delta_bench: the delta encoding's speed on one core (docs/delta.md; internals).
DELTA_BENCH := $(BUILD)/test/perf/delta_bench
$(DELTA_BENCH): $(BUILD)/obj/test/perf/delta_bench.o $(AR_LIB)
	@mkdir -p $(@D)
	$(CC) -o $@ $< $(AR_LIB) -lpthread -ldl $(LDFLAGS_ALL)

# boot_scale: the bootstrap alone on N local processes (scripts/bench-boot.sh; internals).
$(BOOT_SCALE): $(BUILD)/obj/test/perf/boot_scale.o $(AR_LIB)
	@mkdir -p $(@D)
	$(CC) -o $@ $< $(AR_LIB) -lpthread -ldl $(LDFLAGS_ALL)

# join_bench: what a join costs rank 0 at W local ranks (scripts/bench-scale.sh d; internals).
$(JOIN_BENCH): $(BUILD)/obj/test/perf/join_bench.o $(AR_LIB)
	@mkdir -p $(@D)
	$(CC) -o $@ $< $(AR_LIB) -lpthread -ldl $(LDFLAGS_ALL)

# device_refit: 4 processes refit device buffers on one GPU (scripts/gpu-check.sh).
$(DEVICE_REFIT): $(BUILD)/obj/test/perf/device_refit.o $(SO)
	@mkdir -p $(@D)
	$(CC) -o $@ $< -L$(BUILD) -lnccl-net-reshard -ldl -Wl,-rpath,'$$ORIGIN/../..' $(LDFLAGS_ALL)

# nccl_check: a refit through real NCCL on one GPU (scripts/gpu-check.sh; public API only).
$(NCCL_CHECK): $(BUILD)/obj/test/perf/nccl_check.o $(SO)
	@mkdir -p $(@D)
	$(CC) -o $@ $< -L$(BUILD) -lnccl-net-reshard -ldl -Wl,-rpath,'$$ORIGIN/../..' $(LDFLAGS_ALL)

# nccl_net_check: real NCCL's collectives between two processes over its network, the plugin
# or its own (scripts/gpu-check.sh); NCCL loads the plugin, so it links neither.
$(NCCL_NET_CHECK): $(BUILD)/obj/test/perf/nccl_net_check.o
	@mkdir -p $(@D)
	$(CC) -o $@ $< -ldl $(LDFLAGS_ALL)

# m2n_check: NCCL M2N's C API through real NCCL on one GPU (scripts/gpu-check.sh; nccl_m2n.h
# only).
$(M2N_CHECK): $(BUILD)/obj/test/perf/m2n_check.o $(M2N_SO)
	@mkdir -p $(@D)
	$(CC) -o $@ $< -L$(BUILD) -lreshard-m2n -ldl -Wl,-rpath,'$$ORIGIN/../..' $(LDFLAGS_ALL)

# reshard_net_perf: isend/irecv streaming through the exported ncclNetPlugin_v12 table.
$(NET_PERF_BIN): $(BUILD)/obj/test/perf/reshard_net_perf.o $(SO) $(LIB_LINK)
	@mkdir -p $(@D)
	$(CC) -o $@ $< -L$(BUILD) -lnccl-net-reshard $(TOOL_RPATH) $(LDFLAGS_ALL)

# The net plugin conformance driver loads the plugin as NCCL does (dlopen), so it does not
# link it.
$(NET_DRIVER): $(NET_DRIVER_OBJ)
	@mkdir -p $(@D)
	$(CC) -o $@ $^ -ldl -lpthread $(LDFLAGS_ALL)

$(BUILD)/test/fake/libcuda.so.1: test/fake/fake_cuda.c cuda/pack_desc.h cuda/quant.h cuda/delta_desc.h
	@mkdir -p $(@D)
	$(CC) -std=c11 -Wall -Wextra -Werror -O2 -g -fPIC -shared -fvisibility=hidden $(SAN) -I. \
	    -o $@ $<

$(BUILD)/test/fake/libnccl.so.2: test/fake/fake_nccl.c test/fake/fake_nccl.h
	@mkdir -p $(@D)
	$(CC) -std=c11 -Wall -Wextra -Werror -O2 -g -fPIC -shared -fvisibility=hidden $(SAN) -o $@ $<

deps:
	@scripts/apt-install.sh $(DEPS)

# Every include of the library points down its layers (scripts/check-layers.py says how).
check-layers:
	@$(PYTHON) scripts/check-layers.py

test: deps check-layers
	@$(MAKE) --no-print-directory all $(UNIT_BIN) $(NET_DRIVER) $(FAKE_LIBS) $(NCCL_CHECK) $(NCCL_NET_CHECK) $(M2N_CHECK) $(PACK_BENCH) $(DELTA_DEV_BENCH) $(DEVICE_REFIT) $(BOOT_SCALE) $(JOIN_BENCH)
	RESHARD_BUILD=$(BUILD) RESHARD_MAKE_KNOBS="$(if $(SAN),ASAN=1) $(if $(filter 1,$(DEBUG)),DEBUG=1) NVCC=$(NVCC)" \
	    $(if $(SAN),test/asan-run.sh) $(UNIT_BIN) --jobs=$$(nproc) --tap=$(BUILD)/unit.tap \
	    $(TEST_ARGS) || { test/tap-failures.sh $(BUILD)/unit.tap; exit 1; }
ifeq ($(SAN),)
	RESHARD_LIB=$(abspath $(SO)) $(PYTHON) -m unittest discover -s python/tests -v
else
	@echo "python: skipped: an ASan library cannot be loaded into an uninstrumented python3"
endif
ifeq ($(SAN),)
	@if [ "$${RESHARD_SKIP_RDMA:-0}" = 1 ]; then \
	    echo "test-rdma: skipped: RESHARD_SKIP_RDMA=1"; \
	else \
	    BUILD=$(BUILD) scripts/rxe-test.sh; rc=$$?; [ $$rc = 77 ] || exit $$rc; \
	fi
else
	@echo "test-rdma: skipped: sanitizer builds are tested on the host only (make test-rdma runs it)"
endif

# The Python binding against the real frameworks: the versions pinned in
# python/requirements-frameworks.txt (torch, transformers, megatron-core, vLLM) go into a venv
# under build/ (remade when the pins change; pip's own cache keeps the downloads), this package
# is installed into it (vLLM finds its engine through the entry point), and the Python tests
# run there: DTensor on gloo, Megatron-Core and vLLM layers on CPU, the cross-checks of
# scripts/gen-manifest.py. make test runs the same tests with Debian's python3, where the
# framework ones skip saying why.
FW_VENV := build/frameworks
FW_REQ := python/requirements-frameworks.txt

$(FW_VENV)/.installed: $(FW_REQ)
	rm -rf $(FW_VENV)
	$(PYTHON) -m venv $(FW_VENV)
	grep -v 'no-deps' $(FW_REQ) > $(FW_VENV)/with-deps.txt
	grep 'no-deps' $(FW_REQ) | sed 's/#.*//' > $(FW_VENV)/no-deps.txt
	$(FW_VENV)/bin/pip install -q --disable-pip-version-check -r $(FW_VENV)/with-deps.txt
	$(FW_VENV)/bin/pip install -q --disable-pip-version-check --no-deps -r $(FW_VENV)/no-deps.txt
	touch $@

test-frameworks: deps
	@$(MAKE) --no-print-directory all $(FAKE_LIBS) $(FW_VENV)/.installed
	RESHARD_BUILD=$(BUILD) $(FW_VENV)/bin/pip install -q --no-deps --no-build-isolation \
	    --disable-pip-version-check .
	RESHARD_LIB=$(abspath $(SO)) $(FW_VENV)/bin/python -m unittest discover -s python/tests -v

# The verbs transport for real, on soft-RoCE in a qemu VM (scripts/rxe-test.sh, ~2 minutes);
# make test runs it too, unless qemu cannot run here (it says so) or RESHARD_SKIP_RDMA=1.
test-rdma: deps
	@$(MAKE) --no-print-directory all $(UNIT_BIN) $(NET_DRIVER) $(FAKE_LIBS) $(NCCL_CHECK) $(NCCL_NET_CHECK) $(PACK_BENCH) $(DELTA_DEV_BENCH) $(DEVICE_REFIT)
	BUILD=$(BUILD) scripts/rxe-test.sh

demo: deps
	@$(MAKE) --no-print-directory all
	@BUILD=$(BUILD) scripts/demo.sh

# The planning benchmark: the synthetic 1,000-tensor case, then DeepSeek-V3's whole model
# (PP16 x EP16 -> TP32 x DP8 on 512 ranks, from scripts/gen-manifest.py).
bench: $(BENCH_BIN)
	$(BENCH_BIN) $(BENCH_ARGS)
	scripts/gen-manifest.py --model deepseek-v3 --train tp=1,pp=16,ep=16,dp=16 \
	    --infer tp=32,dp=8 -o $(BUILD)/deepseek-v3.json
	$(BENCH_BIN) --manifest $(BUILD)/deepseek-v3.json

# Fuzzing with libFuzzer (clang): the layout spec parser, the bytes a shard's view spans with
# extreme offsets and strides against 128-bit arithmetic (span), the manifest loader, the
# bootstrap's frame decoder, its door and handshake decoders (boot_door), the communicator hello
# (comm_hello), the NCCL plugin's handshake (net), the execution hello's decoders
# (exec_hello: announcements, writer messages, start reports), the ib side channel (ib_cm) and
# what an ib peer causes on the queue pairs, the CTS decoder first (ib_ctl), the chunks of a
# delta refit (delta: checked before anything is written, and round trips), FUZZ_SECONDS (60)
# each under ASan and UBSan. Seeds live in test/fuzz/corpus/<target>; what a run learns goes to
# build/fuzz/corpus/<target>; a crash's reproducer lands in test/fuzz/crashes/ (commit it with
# the fix, as a seed).
FUZZ := build/fuzz
FUZZ_SECONDS ?= 60
FUZZ_TARGETS := spec span manifest boot boot_door comm_hello net exec_hello ib_cm ib_ctl delta
FUZZ_SAN := -fsanitize=address,undefined -fno-sanitize-recover=all
FUZZ_CFLAGS := -std=c11 -D_GNU_SOURCE -Wall -Wextra -Werror -g -O1 $(FUZZ_SAN) \
               -fsanitize=fuzzer-no-link -I.
FUZZ_DEPS := clang libclang-rt-14-dev

$(FUZZ)/obj/%.o: %.c
	@mkdir -p $(@D)
	clang $(FUZZ_CFLAGS) -c $< -o $@

$(FUZZ)/fuzz_%: $(FUZZ)/obj/test/fuzz/fuzz_%.o $(LIB_SRC:%.c=$(FUZZ)/obj/%.o)
	clang $(FUZZ_SAN) -fsanitize=fuzzer -o $@ $^ -lpthread -ldl -lm

$(FUZZ)/fuzz_ib_ctl: $(FUZZ)/obj/test/transport/ib/fake_verbs.o # its stand-in device

fuzz-build: $(FUZZ_TARGETS:%=$(FUZZ)/fuzz_%)

fuzz:
	@$(MAKE) --no-print-directory deps DEPS="$(DEPS) $(FUZZ_DEPS)"
	@$(MAKE) --no-print-directory fuzz-build
	@mkdir -p test/fuzz/crashes
	@for t in $(FUZZ_TARGETS); do \
	    mkdir -p $(FUZZ)/corpus/$$t; \
	    echo "fuzz: $$t for $(FUZZ_SECONDS) s"; \
	    $(FUZZ)/fuzz_$$t -max_total_time=$(FUZZ_SECONDS) -print_final_stats=1 \
	        -artifact_prefix=test/fuzz/crashes/$$t- $(FUZZ)/corpus/$$t test/fuzz/corpus/$$t \
	        2>$(FUZZ)/$$t.log || { tail -40 $(FUZZ)/$$t.log; exit 1; }; \
	    grep -E '^stat::(number_of_executed_units|new_units_added)' $(FUZZ)/$$t.log | tr '\n' ' '; \
	    echo; \
	done

install: all
	install -d $(DESTDIR)$(PREFIX)/lib $(DESTDIR)$(PREFIX)/include $(DESTDIR)$(PREFIX)/bin \
	    $(DESTDIR)$(PREFIX)/lib/pkgconfig
	install -m 755 $(SO) $(M2N_SO) $(DESTDIR)$(PREFIX)/lib/
	install -m 644 plugin/m2n/nccl_m2n.h $(DESTDIR)$(PREFIX)/include/
	install -m 644 base/reshard_status.h $(DESTDIR)$(PREFIX)/include/
	sed -e 's|"base/reshard_status.h"|"reshard_status.h"|' plugin/reshard.h \
	    > $(DESTDIR)$(PREFIX)/include/reshard.h
	chmod 644 $(DESTDIR)$(PREFIX)/include/reshard.h
	install -m 755 $(TOOL_BINS) $(DESTDIR)$(PREFIX)/bin/
	sed -e 's|@PREFIX@|$(PREFIX)|' reshard.pc.in > $(DESTDIR)$(PREFIX)/lib/pkgconfig/reshard.pc

FORMAT_SRC = $(shell git ls-files '*.c' '*.h' '*.cu' 2>/dev/null)
format:
	clang-format -i $(FORMAT_SRC)
format-check:
	clang-format --dry-run -Werror $(FORMAT_SRC)

clean:
	rm -rf build

-include $(LIB_OBJ:.o=.d) $(M2N_OBJ:.o=.d) $(TEST_OBJ:.o=.d) $(PLAN_OBJ:.o=.d) \
    $(BUILD)/obj/test/perf/plan_bench.d $(PERF_OBJ:.o=.d) \
    $(NET_DRIVER_OBJ:.o=.d) \
    $(BUILD)/obj/test/perf/reshard_net_perf.d $(BUILD)/obj/test/perf/nccl_net_check.d
