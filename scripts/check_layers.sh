#!/bin/sh
# check_layers.sh - TAP test of the engine's dependency rules (DESIGN.md) on the source text: every
# #include "..." of a file in engine/src/<layer>/ must name a header of its own layer or of a layer
# the rules allow (a path with ../ counts where it points), only lua/ includes Lua's headers, only
# sandbox/ libseccomp's, only http/ libcurl's and only serve/ libmicrohttpd's. The compiler
# enforces the same rules through include paths (Makefile, layer_inc); this check also catches
# relative paths, and a last case shows the compiler refusing a forbidden include.
# usage: sh scripts/check_layers.sh "base: tensor:base model:base,tensor ..." [CC]
set -u
RULES=${1:?usage: check_layers.sh RULES [CC]}
CC=${2:-cc}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT/engine/src" || exit 1
n=0
failures=0
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

allowed() { # allowed LAYER: the layer itself and what the rules let it include
  for r in $RULES; do
    [ "${r%%:*}" = "$1" ] && { set -- "$1" $(echo "${r#*:}" | tr ',' ' '); echo "$*"; return; }
  done
}

# which layer folder holds the header an #include in $dir names ("" when none does)
owner() { # owner DIR NAME ALLOWED...
  dir=$1 name=$2
  shift 2
  case "$name" in
    */*) p=$(cd "$dir" 2>/dev/null && realpath -m "$name") || return
         p=${p#"$ROOT/engine/src/"}
         case "$p" in */*) echo "${p%%/*}" ;; esac
         return ;;
  esac
  for l in "$@"; do [ -f "$l/$name" ] && { echo "$l"; return; }; done
  for l in */; do l=${l%/}; [ -f "$l/$name" ] && { echo "$l"; return; }; done
}

for r in $RULES; do
  layer=${r%%:*}
  ok=$(allowed "$layer")
  : >"$tmp/bad"
  for f in "$layer"/*.c "$layer"/*.h; do
    [ -f "$f" ] || continue
    grep -n '^[[:space:]]*#[[:space:]]*include' "$f" | while IFS= read -r line; do
      spec=$(echo "$line" | sed -n 's/.*#[[:space:]]*include[[:space:]]*\(["<][^">]*[">]\).*/\1/p')
      name=$(echo "$spec" | sed 's/^.//; s/.$//')
      case "$spec" in
        \"*)
          o=$(owner "$layer" "$name" $ok)
          [ -n "$o" ] || continue # a header outside engine/src (moonrl.h, generated Lua modules)
          case " $ok " in *" $o "*) ;; *) echo "$f:${line%%:*}: includes $name from $o/" >>"$tmp/bad" ;; esac ;;
        \<lua.h\>|\<lauxlib.h\>|\<lualib.h\>|\<luaconf.h\>)
          [ "$layer" = lua ] || echo "$f:${line%%:*}: includes Lua's $name" >>"$tmp/bad" ;;
        \<seccomp.h\>)
          [ "$layer" = sandbox ] || echo "$f:${line%%:*}: includes libseccomp's $name" >>"$tmp/bad" ;;
        \<curl/*\>)
          [ "$layer" = http ] || echo "$f:${line%%:*}: includes libcurl's $name" >>"$tmp/bad" ;;
        \<microhttpd.h\>)
          [ "$layer" = serve ] || echo "$f:${line%%:*}: includes libmicrohttpd's $name" >>"$tmp/bad" ;;
      esac
    done
  done
  n=$((n + 1))
  if [ -s "$tmp/bad" ]; then
    echo "not ok $n - engine/src/$layer/ includes only $(echo "$ok" | sed 's/ /, /g')"
    sed 's/^/# /' "$tmp/bad"
    failures=$((failures + 1))
  else
    echo "ok $n - engine/src/$layer/ includes only $(echo "$ok" | sed 's/ /, /g')"
  fi
done

# every folder of engine/src has rules
n=$((n + 1))
missing=
for l in */; do l=${l%/}; [ -n "$(allowed "$l")" ] || missing="$missing $l"; done
if [ -z "$missing" ]; then echo "ok $n - every folder of engine/src is a layer with rules"
else echo "not ok $n - folders without rules:$missing"; failures=$((failures + 1)); fi

# the compiler refuses what the rules forbid: objective/ code including a tokenizer header
n=$((n + 1))
inc="-I$ROOT/engine/include -Iobjective"
for d in $(allowed objective); do inc="$inc -I$d"; done
printf '#include "advantage.h"\n#include "tokenizer_internal.h"\n' >"$tmp/bad.c"
printf '#include "advantage.h"\n#include "utf8.h"\n' >"$tmp/good.c"
if $CC -std=c11 -fsyntax-only $inc "$tmp/good.c" >"$tmp/log" 2>&1 &&
  ! $CC -std=c11 -fsyntax-only $inc "$tmp/bad.c" >>"$tmp/log" 2>&1 &&
  grep -q 'tokenizer_internal.h' "$tmp/log"; then
  echo "ok $n - objective/ with its include paths cannot include tokenizer_internal.h"
else
  echo "not ok $n - objective/ with its include paths cannot include tokenizer_internal.h"
  sed 's/^/# /' "$tmp/log"
  failures=$((failures + 1))
fi
[ "$failures" -eq 0 ]
