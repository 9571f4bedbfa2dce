#!/bin/sh
# SPDX-License-Identifier: MIT
# deps.sh ITEM ... - makes sure each Debian package an ITEM names is there,
# installing the missing ones with apt-get when running as root. Without
# root it names the missing packages and fails, so nothing is half-done
# silently. An ITEM is
#   PACKAGE:COMMAND     the command exists (gcc:gcc, pkgconf:pkg-config)
#   PACKAGE:py:MODULE   /usr/bin/python3 imports MODULE (python3-numpy:py:numpy)
#   PACKAGE             dpkg lists it installed (a library with nothing to try)
set -e
missing=""
for item in "$@"; do
  pkg=${item%%:*}
  what=${item#*:}
  if [ "$pkg" = "$item" ]; then
    dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q 'install ok installed' ||
      missing="$missing $pkg"
  elif [ "${what#py:}" != "$what" ]; then
    /usr/bin/python3 -c "import ${what#py:}" >/dev/null 2>&1 || missing="$missing $pkg"
  else
    command -v "$what" >/dev/null 2>&1 || missing="$missing $pkg"
  fi
done
[ -z "$missing" ] && exit 0
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
  echo "deps: installing$missing" >&2
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq >/dev/null
  # shellcheck disable=SC2086
  apt-get install -y -qq --no-install-recommends $missing >/dev/null
  exit 0
fi
echo "deps: missing$missing; install them with: sudo apt-get install$missing" >&2
exit 1
