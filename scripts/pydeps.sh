#!/bin/sh
# pydeps.sh PACKAGE[:MODULE] ... - makes sure each Debian PACKAGE is there:
# with :MODULE, that /usr/bin/python3 can import MODULE; without, that dpkg
# lists PACKAGE as installed (libraries with no command or module to try).
# Installs what is missing with apt-get when running as root; otherwise
# names the missing packages and fails, as deps.sh does.
set -e
missing=""
for arg in "$@"; do
  pkg=${arg%%:*}
  if [ "$pkg" != "$arg" ]; then
    /usr/bin/python3 -c "import ${arg#*:}" >/dev/null 2>&1 || missing="$missing $pkg"
  else
    dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q 'install ok installed' ||
      missing="$missing $pkg"
  fi
done
[ -z "$missing" ] && exit 0
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
  echo "pydeps: installing$missing (torch and OpenBLAS: about 640 MB)" >&2
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq >/dev/null
  # shellcheck disable=SC2086
  apt-get install -y -qq --no-install-recommends $missing >/dev/null
  exit 0
fi
echo "pydeps: missing$missing; install them with: sudo apt-get install$missing" >&2
exit 1
