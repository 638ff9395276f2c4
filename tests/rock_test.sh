#!/bin/sh
# rock_test.sh - TAP test of the rockspec: `luarocks --lua-version 5.4 make` into a temporary tree
# (offline: nothing is fetched), the tree's files, then stock lua5.4 with package.path and
# package.cpath on that tree only requiring moonrl from it, multiplying two tensors, running the
# policy model forward (finite logits that differ) and writing a report with moonrl.report.
# The build reuses BUILD's objects (the rockspec's make backend builds into build/ by default),
# so under the sanitizer build (asan) it is skipped: the rock is a plain build.
# usage: sh tests/rock_test.sh BUILD [asan]
set -u
BUILD=${1:?usage: rock_test.sh BUILD [asan]}
MODE=${2:-}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT" || exit 1
if [ "$MODE" = asan ]; then
  echo "ok 1 - luarocks make # SKIP the rock is not a sanitizer build"
  exit 0
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
tree="$tmp/tree"
n=0
failures=0

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

# no rocks server may be asked: an unreachable one makes any fetch fail at once
check "luarocks --lua-version 5.4 --tree <tmp> make moonrl-0.1.0-1.rockspec" \
  env LUAROCKS_CONFIG=/dev/null luarocks --lua-version 5.4 --tree "$tree" \
    --only-server=http://127.0.0.1:9/ \
    make moonrl-0.1.0-1.rockspec BUILD="$BUILD"

tree_files() {
  for f in lib/lua/5.4/moonrl/core.so share/lua/5.4/moonrl/init.lua \
           share/lua/5.4/moonrl/train/init.lua share/lua/5.4/moonrl/report.lua \
           lib/luarocks/rocks-5.4/moonrl/0.1.0-1/moonrl-0.1.0-1.rockspec; do
    [ -f "$tree/$f" ] || { echo "missing $f"; return 1; }
  done
}
check "the tree holds the C module, the Lua modules and the rockspec" tree_files

cat >"$tmp/use.lua" <<'LUA'
local tree = arg[1]
package.path = tree .. "/share/lua/5.4/?.lua;" .. tree .. "/share/lua/5.4/?/init.lua;" .. package.path
package.cpath = tree .. "/lib/lua/5.4/?.so;" .. package.cpath
local rl = require "moonrl"
assert(package.searchpath("moonrl", package.path):sub(1, #tree) == tree, "moonrl not from the tree")
assert(package.searchpath("moonrl.core", package.cpath):sub(1, #tree) == tree, "core not from the tree")
local c = rl.tensor.matmul(rl.tensor.from { { 1, 2 }, { 3, 4 } }, rl.tensor.from { { 5, 6 }, { 7, 8 } })
assert(c:get(1, 1) == 19 and c:get(1, 2) == 22 and c:get(2, 1) == 43 and c:get(2, 2) == 50, tostring(c))
local m = rl.model.new { vocab = 16, dim = 8, layers = 1, heads = 2, ffn = 16, ctx = 8, seed = 1 }
local logits = m:logits { { 1, 2, 3 } }
local sum, lo, hi = 0, math.huge, -math.huge
for v = 1, 16 do
  local x = logits:get(1, 3, v)
  assert(x == x, "a NaN logit")
  lo, hi = math.min(lo, x), math.max(hi, x)
  sum = sum + math.exp(x)
end
assert(sum > 0 and sum < math.huge and hi > lo, "logits of the last position: " .. lo .. " .. " .. hi)
local dir = os.tmpname()
os.remove(dir)
assert(rl.fs.mkdir(dir))
local f = assert(io.open(dir .. "/metrics.jsonl", "w"))
f:write('{"step":1,"reward/mean":0.5}\n')
f:close()
local path = assert(require("moonrl.report").write(dir))
assert(io.open(path):read("a"):find("reward/mean", 1, true))
os.remove(path); os.remove(dir .. "/metrics.jsonl"); os.remove(dir)
print("ok")
LUA
check "lua5.4 requires moonrl from the tree: matmul, a model forward, a report" \
  env -u LUA_PATH -u LUA_CPATH -u LUA_PATH_5_4 -u LUA_CPATH_5_4 LD_PRELOAD="${MOONRL_PRELOAD:-}" \
    lua5.4 "$tmp/use.lua" "$tree"

echo "1..$n"
[ "$failures" -eq 0 ]
