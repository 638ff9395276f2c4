#!/bin/sh
# deps_fuzz.sh - installs the Debian packages `make fuzz` needs that are missing (as root), or
# prints the command to run: clang and its runtime libraries (libFuzzer, the sanitizers).
set -eu
PACKAGES="clang libclang-rt-14-dev"
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
  echo "make fuzz needs these Debian packages:$missing" >&2
  echo "install them with:  sudo apt-get update && sudo apt-get install -y$missing" >&2
  exit 1
fi
echo "deps_fuzz: installing$missing"
export DEBIAN_FRONTEND=noninteractive
apt-get update -q >/dev/null
# shellcheck disable=SC2086
apt-get install -y -q --no-install-recommends $missing >/dev/null
echo "deps_fuzz: done"
