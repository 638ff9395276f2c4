#!/bin/sh
# deps.sh - installs the Debian packages moonrl needs that are missing (as root), or prints the
# command to run. Quiet when everything is present. Used by `make deps` (and so by make, make test,
# make demo); with package names as arguments it checks those instead (`make fuzz` passes clang
# and its runtime libraries).
set -eu
PACKAGES="gcc make pkg-config lua5.4 liblua5.4-dev luajit libluajit-5.1-dev libopenblas-dev
libcurl4-openssl-dev libmicrohttpd-dev lua-lpeg lua-busted libseccomp-dev libreadline-dev tmux binutils"
[ $# -gt 0 ] && PACKAGES="$*"
missing=""
for p in $PACKAGES; do
  status=$(dpkg-query -W -f='${Status}' "$p" 2>/dev/null || true)
  case "$status" in
    *"install ok installed"*) ;;
    *) missing="$missing $p" ;;
  esac
done
[ -z "$missing" ] && exit 0
if [ "$(id -u)" -ne 0 ]; then
  echo "moonrl needs these Debian packages:$missing" >&2
  echo "install them with:  sudo apt-get update && sudo apt-get install -y$missing" >&2
  exit 1
fi
echo "deps: installing$missing"
export DEBIAN_FRONTEND=noninteractive
apt-get update -q >/dev/null
# shellcheck disable=SC2086
apt-get install -y -q --no-install-recommends $missing >/dev/null
echo "deps: done"
