#!/bin/sh
# run_tests.sh - runs every test suite against one build directory and prints a TAP summary per
# suite, the details of failures, and finally one line "N passed, N failed".
# usage: sh scripts/run_tests.sh BUILD [asan]
set -u
BUILD=${1:?usage: run_tests.sh BUILD [asan]}
MODE=${2:-}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT" || exit 1
BUILD_ABS=$(cd "$BUILD" && pwd)

export MOONRL_ROOT="$ROOT" MOONRL_BUILD="$BUILD_ABS" MOONRL_STAGE="$BUILD_ABS/stage"
export MOONRL_HISTORY=""           # the REPL keeps no history file unless a test asks for one
export LUA_PATH="$ROOT/lua/?.lua;$BUILD_ABS/lua/?.lua;;"  # LuaJIT: moonrl.ffi + generated cdef
export MOONRL_LIB="$BUILD_ABS/libmoonrl.so.0"
export MOONRL_NPM="$BUILD_ABS/npm"  # the JavaScript tokenizer reference (Makefile installs it)
export MOONRL_COMPAT="$BUILD_ABS/compat"  # the openai npm client for tests/compat (Makefile)
if [ "$MODE" = asan ]; then
  # stock interpreters (lua5.4, luajit) loading the sanitized library need the runtime first
  MOONRL_PRELOAD="$(gcc -print-file-name=libasan.so) $(gcc -print-file-name=libubsan.so)"
  export MOONRL_PRELOAD
  export ASAN_OPTIONS="detect_leaks=1:abort_on_error=0" UBSAN_OPTIONS="print_stacktrace=1"
fi

passed=0
failed=0
skipped=0
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# run_suite NAME COMMAND...: counts "ok"/"not ok" TAP lines; a non-zero exit with no failing
# test line (a crash, a sanitizer report, a load error) counts as one more failure.
run_suite() {
  name=$1
  shift
  out="$tmp/out"
  "$@" >"$out" 2>&1 </dev/null
  rc=$?
  # (busted's pending tests are "ok N - # SKIP reason": skipped, not passed)
  k=$(grep -c '^ok .*# SKIP' "$out")
  p=$(($(grep -c '^ok ' "$out") - k))
  f=$(grep -c '^not ok ' "$out")
  if [ "$rc" -ne 0 ] && [ "$f" -eq 0 ]; then
    f=1
    echo "== $name: exited with status $rc; output:"
    tail -n 60 "$out"
  elif [ "$f" -gt 0 ]; then
    echo "== $name: failures:"
    awk '/^not ok /{show=1; print; next} /^ok /{show=0} show && /^#/{print}' "$out"
    grep -E 'ERROR: (Address|Leak|Undefined)Sanitizer|runtime error:' "$out" | head -n 20
  fi
  if [ "$k" -gt 0 ]; then
    printf '%-28s %4d passed, %d failed, %d skipped:\n' "$name" "$p" "$f" "$k"
    grep -o '# SKIP.*' "$out" | sed 's/^# SKIP [^ ]*: /    /' | sort | uniq -c
  else
    printf '%-28s %4d passed, %d failed\n' "$name" "$p" "$f"
  fi
  passed=$((passed + p))
  skipped=$((skipped + k))
  failed=$((failed + f))
}

run_suite "layers: engine/src" sh scripts/check_layers.sh "${MOONRL_LAYER_RULES:?the Makefile sets it}"
for t in "$BUILD"/tests/test_*; do
  [ -x "$t" ] && run_suite "c: $(basename "$t")" "$t"
done
run_suite "lua: tests/lua" "$BUILD/moonrl" run /usr/bin/busted -o TAP tests/lua
run_suite "luajit: tests/luajit" env LD_PRELOAD="${MOONRL_PRELOAD:-}" luajit /usr/bin/busted -o TAP tests/luajit
run_suite "node: tests/compat" node --test --test-reporter=tap tests/compat/openai_sdk.test.mjs
run_suite "browser: tests/report" node --test --test-reporter=tap tests/report/report_browser.test.mjs
run_suite "install + embedding" sh tests/install_test.sh "$BUILD" "$MODE"
run_suite "luarocks make" sh tests/rock_test.sh "$BUILD" "$MODE"

[ "$skipped" -gt 0 ] && echo "($skipped skipped: see above)"
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
