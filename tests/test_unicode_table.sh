#!/bin/sh
# SPDX-License-Identifier: MIT
# test_unicode_table.sh SOURCE_DIR - lm/unicode_table.h is exactly what
# scripts/gen-unicode-table.py writes from /usr/bin/python3's unicodedata
# (skipped, 77, without that Python, or when it carries another Unicode
# version than the committed table: the generator's output depends on it).
set -u
SRC=${1:?usage: test_unicode_table.sh SOURCE_DIR}
PY=/usr/bin/python3
T=$SRC/lm/unicode_table.h
if [ ! -x $PY ]; then
    echo "test_unicode_table: no $PY: skipped"
    exit 77
fi
v=$($PY -c 'import unicodedata; print(unicodedata.unidata_version)') || exit 1
if ! grep -q "LM_UNICODE_VERSION \"$v\"" "$T"; then
    echo "test_unicode_table: $PY carries Unicode $v, the table another: skipped"
    exit 77
fi
$PY "$SRC/scripts/gen-unicode-table.py" | cmp - "$T" || {
    echo "FAIL: lm/unicode_table.h is not what scripts/gen-unicode-table.py writes" >&2
    exit 1
}
echo "test_unicode_table: lm/unicode_table.h is the generator's (Unicode $v)"
