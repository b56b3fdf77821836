#!/bin/sh
# SPDX-License-Identifier: Apache-2.0
# usage: scripts/apt-install.sh PACKAGE ...
#
# Installs those of the Debian packages named that are not installed yet (with sudo when not
# root). Runs on one machine wait for each other (flock on /tmp/.reshard-apt.lock) and then
# look again, and apt waits for any other apt or dpkg holding its locks (DPkg::Lock::Timeout),
# so two `make test` started together do not fail on the package lock.
# Environment: APT_NO_RECOMMENDS=1 adds --no-install-recommends; APT_WAIT=600 seconds to wait.
set -eu
case ${1:-} in
-h | --help) awk 'NR > 2 && !/^#/ { exit } NR > 2 { sub(/^# ?/, ""); print }' "$0"; exit 0 ;;
-*) echo "apt-install: unknown option '$1' (-h says more)" >&2; exit 2 ;;
esac
WAIT=${APT_WAIT:-600}

missing() {
    m=""
    for p in "$@"; do
        dpkg-query -W -f='${Status}\n' "$p" 2>/dev/null | grep -q '^install ok installed$' ||
            m="$m $p"
    done
    echo "$m"
}

[ -n "$(missing "$@")" ] || exit 0
SUDO=
[ "$(id -u)" = 0 ] || SUDO=sudo
if [ -n "$SUDO" ] && ! command -v sudo >/dev/null; then
    echo "apt-install: not root and no sudo: as root run 'apt-get install$(missing "$@")'" >&2
    exit 1
fi
exec 9>>/tmp/.reshard-apt.lock
if command -v flock >/dev/null && ! flock -w "$WAIT" 9; then
    echo "apt-install: another install held /tmp/.reshard-apt.lock for $WAIT s" >&2
    exit 1
fi
todo=$(missing "$@") # another run may have installed them while this one waited
[ -n "$todo" ] || exit 0
echo "apt-install: installing$todo"
lock="-o DPkg::Lock::Timeout=$WAIT"
extra=""
[ "${APT_NO_RECOMMENDS:-0}" = 1 ] && extra=--no-install-recommends
# apt-get update takes the lists lock, which DPkg::Lock::Timeout does not cover: try again
tries=0
until $SUDO apt-get $lock update -qq; do
    tries=$((tries + 1))
    [ "$tries" -lt 30 ] || { echo "apt-install: apt-get update kept failing" >&2; exit 1; }
    sleep 10
done
# shellcheck disable=SC2086
$SUDO env DEBIAN_FRONTEND=noninteractive apt-get $lock install -y -qq $extra $todo
