#!/bin/sh
# SPDX-License-Identifier: MIT
# deps.sh PACKAGE:COMMAND ... - makes sure each COMMAND exists, installing the
# Debian PACKAGE with apt-get when running as root. Without root it names the
# missing packages and fails, so nothing is half-done silently.
set -e
missing=""
for pair in "$@"; do
  pkg=${pair%%:*}
  cmd=${pair#*:}
  command -v "$cmd" >/dev/null 2>&1 || missing="$missing $pkg"
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
