#!/bin/sh
# install_test.sh - TAP test of `make install` into a staging prefix: the installed files, the
# pkg-config file, `require "moonrl"` in stock lua5.4 and `require "moonrl.ffi"` in luajit with the
# paths `moonrl env` prints, the embedding example built against the installed pkg-config file and
# run under the leak checker (static and shared), the exported symbols, and `make uninstall`.
# usage: sh tests/install_test.sh BUILD [asan]
set -u
BUILD=${1:?usage: install_test.sh BUILD [asan]}
MODE=${2:-}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT" || exit 1
STAGE="$(cd "$BUILD" && pwd)/stage"
SANITIZE=
[ "$MODE" = asan ] && SANITIZE=1
PRELOAD=${MOONRL_PRELOAD:-}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
n=0
failures=0

# check DESCRIPTION COMMAND...: one TAP line; the command's output is shown when it fails.
check() {
  desc=$1
  shift
  n=$((n + 1))
  if "$@" >"$tmp/log" 2>&1; then
    echo "ok $n - $desc"
  else
    echo "not ok $n - $desc"
    sed 's/^/# /' "$tmp/log" | tail -n 30
    failures=$((failures + 1))
  fi
}

rm -rf "$STAGE"
check "make install PREFIX=<stage>" \
  make --no-print-directory install PREFIX="$STAGE" BUILD="$BUILD" SANITIZE="$SANITIZE"

files_installed() {
  for f in include/moonrl.h lib/libmoonrl.a lib/libmoonrl.so lib/libmoonrl.so.0 \
    lib/libmoonrl.so.0.1.0 lib/pkgconfig/moonrl.pc lib/libmoonrl-core.a lib/libmoonrl-core.so \
    lib/libmoonrl-core.so.0 lib/libmoonrl-core.so.0.1.0 lib/pkgconfig/moonrl-core.pc bin/moonrl lib/lua/5.4/moonrl/core.so \
    share/lua/5.4/moonrl/init.lua \
    share/lua/5.4/moonrl/train/init.lua share/lua/5.4/moonrl/train/advantage.lua share/lua/5.1/moonrl/ffi.lua share/lua/5.1/moonrl/ffi_cdef.lua; do
    [ -e "$STAGE/$f" ] || { echo "missing $f"; return 1; }
  done
  grep -q "^local LIBDIR = \"$STAGE/lib\"" "$STAGE/share/lua/5.1/moonrl/ffi_cdef.lua" ||
    { echo "ffi_cdef.lua does not name the install libdir"; return 1; }
}
check "installed files are in place" files_installed

export PKG_CONFIG_PATH="$STAGE/lib/pkgconfig"
pkgconfig_works() {
  libs=$(pkg-config --libs moonrl) && cflags=$(pkg-config --cflags moonrl) || return 1
  echo "libs: $libs / cflags: $cflags"
  case "$libs" in *-lmoonrl*) ;; *) return 1 ;; esac
  case "$cflags" in *"-I$STAGE/include"*) ;; *) return 1 ;; esac
  [ "$(pkg-config --modversion moonrl)" = 0.1.0 ]
}
check "pkg-config --libs/--cflags/--modversion moonrl" pkgconfig_works

# The environment `moonrl env` prints for the installed layout, in a clean shell.
in_env() {
  env -u LUA_PATH -u LUA_PATH_5_4 -u LUA_CPATH -u LUA_CPATH_5_4 -u MOONRL_LIB sh -c \
    "eval \"\$('$STAGE/bin/moonrl' env)\" && unset MOONRL_LIB && LD_PRELOAD='$PRELOAD' $*"
}
lua54_require() {
  out=$(in_env "lua5.4 -e 'local rl = require \"moonrl\"; print(rl.version, rl.tensor.zeros{2,3}:numel())'")
  echo "$out"
  [ "$out" = "$(printf '0.1.0\t6')" ]
}
check "lua5.4 -e 'require \"moonrl\"' with the paths of moonrl env" lua54_require
luajit_require() {
  out=$(in_env "luajit -e 'local rl = require \"moonrl.ffi\"; print(rl.version, rl.tensor.zeros{2,3}:numel())'")
  echo "$out"
  [ "$out" = "$(printf '0.1.0\t6')" ]
}
check "luajit -e 'require \"moonrl.ffi\"' finds the installed library" luajit_require

SAN="-fsanitize=address,undefined -fno-omit-frame-pointer"
embed_shared() {
  # shellcheck disable=SC2046
  cc -std=c11 -Wall -Wextra -Werror $SAN engine/examples/embed.c \
    $(pkg-config --cflags --libs moonrl) -Wl,-rpath,"$STAGE/lib" -o "$tmp/embed" || return 1
  ASAN_OPTIONS=detect_leaks=1 "$tmp/embed"
}
check "embed.c builds against the installed moonrl.pc and runs leak-free (shared)" embed_shared
embed_static() {
  # shellcheck disable=SC2046
  cc -std=c11 -Wall -Wextra -Werror $SAN engine/examples/embed.c $(pkg-config --cflags moonrl) \
    "$STAGE/lib/libmoonrl.a" $(pkg-config --static --libs-only-l moonrl | sed 's/-lmoonrl//') \
    -o "$tmp/embed_static" || return 1
  ASAN_OPTIONS=detect_leaks=1 "$tmp/embed_static"
}
check "embed.c links libmoonrl.a with pkg-config --static and runs leak-free" embed_static

rl_loop_shared() {
  # shellcheck disable=SC2046
  cc -std=c11 -Wall -Wextra -Werror $SAN engine/examples/rl_loop.c \
    $(pkg-config --cflags --libs moonrl) -Wl,-rpath,"$STAGE/lib" -o "$tmp/rl_loop" || return 1
  ASAN_OPTIONS=detect_leaks=1 "$tmp/rl_loop" >"$tmp/rl_loop.out"
  rc=$?
  tail -n 3 "$tmp/rl_loop.out"
  return $rc
}
check "rl_loop.c (RL from C alone) builds against moonrl.pc, learns its task, runs leak-free" rl_loop_shared

# libmoonrl-core: the engine without Lua. The same RL loop links it alone: no Lua library is loaded
# (ldd), and the static link leaves out libseccomp too, since nothing calls the sandbox.
core_shared() {
  # shellcheck disable=SC2046
  cc -std=c11 -Wall -Wextra -Werror $SAN engine/examples/rl_loop.c \
    $(pkg-config --cflags --libs moonrl-core) -Wl,-rpath,"$STAGE/lib" -o "$tmp/rl_core" || return 1
  ldd "$tmp/rl_core"
  ldd "$tmp/rl_core" | grep -q 'libmoonrl-core.so.0' || { echo "not linked to libmoonrl-core"; return 1; }
  ! ldd "$tmp/rl_core" | grep -qi 'lua' || { echo "a Lua library is loaded"; return 1; }
  ASAN_OPTIONS=detect_leaks=1 "$tmp/rl_core" >"$tmp/rl_core.out"
}
check "rl_loop.c links libmoonrl-core (moonrl-core.pc): runs leak-free, no Lua library loaded" core_shared
core_static() {
  # shellcheck disable=SC2046
  cc -std=c11 -Wall -Wextra -Werror $SAN engine/examples/rl_loop.c $(pkg-config --cflags moonrl-core) \
    -Wl,--as-needed "$STAGE/lib/libmoonrl-core.a" \
    $(pkg-config --static --libs-only-l moonrl-core | sed 's/-lmoonrl-core//') -o "$tmp/rl_core_static" ||
    return 1
  ldd "$tmp/rl_core_static"
  ! ldd "$tmp/rl_core_static" | grep -qi 'lua\|seccomp' || { echo "Lua or libseccomp is loaded"; return 1; }
  ! nm "$tmp/rl_core_static" | grep -q ' T mrl_script_new$' || { echo "the script API was linked"; return 1; }
  ASAN_OPTIONS=detect_leaks=1 "$tmp/rl_core_static" >"$tmp/rl_core_static.out"
}
check "rl_loop.c links libmoonrl-core.a: no Lua, no libseccomp, runs leak-free" core_static

# (a sanitizer build adds its own __odr_asan / __asan symbols, which are not ours to name)
exports_prefixed() {
  bad=$(nm -D --defined-only "$STAGE/lib/libmoonrl.so" | awk '{print $3}' | grep -v '^mrl_' |
    grep -v '^__\(odr_\)\?asan')
  [ -z "$bad" ] || { echo "libmoonrl.so exports: $bad"; return 1; }
  bad=$(nm -g --defined-only "$STAGE/lib/libmoonrl.a" | awk 'NF == 3 {print $3}' | grep -v '^mrl_' |
    grep -v '^__\(odr_\)\?asan')
  [ -z "$bad" ] || { echo "libmoonrl.a defines: $bad"; return 1; }
  mod=$(nm -D --defined-only "$STAGE/lib/lua/5.4/moonrl/core.so" | awk '{print $3}')
  [ "$mod" = luaopen_moonrl_core ] || { echo "core.so exports: $mod"; return 1; }
  bad=$(nm -D --defined-only "$STAGE/lib/libmoonrl-core.so" | awk '{print $3}' | grep -v '^mrl_' |
    grep -v '^__\(odr_\)\?asan')
  [ -z "$bad" ] || { echo "libmoonrl-core.so exports: $bad"; return 1; }
  ! nm -D --defined-only "$STAGE/lib/libmoonrl-core.so" | grep -q ' T mrl_script_new$' ||
    { echo "libmoonrl-core.so has the script API"; return 1; }
  nm -D --defined-only "$STAGE/lib/libmoonrl.so" | grep -q ' T mrl_tensor_matmul$'
}
check "every exported symbol has the mrl_ prefix (core.so: luaopen_moonrl_core only)" exports_prefixed

soname_versioned() {
  objdump -p "$STAGE/lib/libmoonrl.so.0.1.0" | grep -q 'SONAME *libmoonrl.so.0$'
}
check "libmoonrl.so carries the versioned soname libmoonrl.so.0" soname_versioned

uninstalled() {
  make --no-print-directory uninstall PREFIX="$STAGE" BUILD="$BUILD" || return 1
  left=$(find "$STAGE" -type f -o -type l)
  [ -z "$left" ] || { echo "left behind: $left"; return 1; }
}
check "make uninstall removes every installed file" uninstalled

echo "1..$n"
[ "$failures" -eq 0 ]
