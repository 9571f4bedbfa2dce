#!/bin/sh
# SPDX-License-Identifier: MIT
# test_python_install.sh CMAKE BUILD_DIR SOURCE_DIR PYTHON - the Python package
# installed the way its README says: `cmake --install` of the build to a
# temporary prefix, then `PYTHON -m pip install` of a copy of python/ into a
# temporary target (--no-build-isolation --no-index --no-deps: the machine's
# setuptools and numpy, nothing downloaded; the copy keeps pip's build files
# out of the source tree). The installed package, imported outside the
# source tree with KVEVICT_LIBRARY unset, must find the installed library
# through pkg-config (PKG_CONFIG_PATH=PREFIX/lib/pkgconfig), report the
# CMake version, and evaluate a policy; without that hint, it must fail to
# import with a message naming what it tried. The copy `cmake --install`
# puts in PREFIX/share/kvevict/python finds the library by itself, with no
# environment at all: imported where it is (beside the package), after the
# prefix is moved (the relative path it recorded), and pip-installed
# elsewhere (the absolute prefix it recorded at install time). Exit 77 (skipped, reason
# printed) when PYTHON lacks numpy, pip or setuptools, or pkg-config is
# missing.
set -u
CMAKE=${1:?usage: test_python_install.sh CMAKE BUILD_DIR SOURCE_DIR PYTHON}
BUILD=${2:?}
SRC=${3:?}
PY=${4:?}
for need in numpy pip setuptools; do
    if ! "$PY" -c "import $need" >/dev/null 2>&1; then
        echo "SKIP: $PY cannot import $need (Debian: apt-get install python3-$need)"
        exit 77
    fi
done
if ! command -v pkg-config >/dev/null 2>&1; then
    echo "SKIP: pkg-config is not installed (apt-get install pkgconf)"
    exit 77
fi
. "$(dirname "$0")/check.sh"
scratch kvevict-pyinstall

# docs/python.md's install line is the one this test runs (less --target):
# the interpreter Debian's numpy is in, the machine's setuptools
grep -q '^/usr/bin/python3 -m pip install --no-build-isolation /usr/local/share/kvevict/python$' \
    "$SRC/docs/python.md" || fail "docs/python.md's pip line is not the offline one this test runs"
VERSION=$(sed -n 's/^project(kvevict VERSION \([0-9.]*\) .*/\1/p' "$SRC/CMakeLists.txt")
"$CMAKE" --install "$BUILD" --prefix "$D/prefix" >"$D/install.log" 2>&1 ||
    { cat "$D/install.log" >&2; exit 1; }
cp -R "$SRC/python" "$D/src"
if ! (cd "$D" && "$PY" -m pip install --quiet --no-build-isolation --no-index --no-deps \
        --disable-pip-version-check --target "$D/site" "$D/src") >"$D/pip.log" 2>&1; then
    cat "$D/pip.log" >&2
    fail "pip install of python/ failed"
    exit 1
fi
[ -f "$D/site/kvevict/__init__.py" ] || fail "pip installed no kvevict package"
ls "$D/site" | grep -q "^kvevict-$VERSION.dist-info$" || fail "no kvevict-$VERSION.dist-info"

LIBDIR=$(PKG_CONFIG_PATH="$D/prefix/lib/pkgconfig" pkg-config --variable=libdir kvevict-eval)
cat >"$D/smoke.py" <<'EOF'
import os, sys
import kvevict
libdir, version = sys.argv[1], sys.argv[2]
assert os.path.realpath(os.path.dirname(kvevict.library_path)) == os.path.realpath(libdir), \
    kvevict.library_path
assert os.path.dirname(kvevict.__file__).startswith(sys.argv[3]), kvevict.__file__
assert kvevict.version() == version == kvevict.__version__, (kvevict.version(), version)
with kvevict.Trace.open("canonical:steps=300") as tr:
    r = kvevict.evaluate(tr, ["h2o:budget=64", "streaming:budget=64"])
assert [x["policy"] for x in r] == ["h2o:budget=64,recent_window=32",
                                    "streaming:budget=64,sinks=4"], r
assert 0.5 < r[0]["retained_mass"] < 1.0, r
print("installed kvevict", kvevict.version(), "from", kvevict.library_path)
EOF
if (cd "$D" && env -u KVEVICT_LIBRARY PYTHONPATH="$D/site" \
        PKG_CONFIG_PATH="$D/prefix/lib/pkgconfig" "$PY" smoke.py "$LIBDIR" "$VERSION" "$D/site") \
        >"$D/smoke.log" 2>&1; then
    cat "$D/smoke.log"
else
    cat "$D/smoke.log" >&2
    fail "the installed package does not work through pkg-config"
fi
# The installed copy: no KVEVICT_LIBRARY, no PKG_CONFIG_PATH.
COPY="$D/prefix/share/kvevict/python"
[ -f "$COPY/kvevict/_install.py" ] || fail "cmake --install wrote no $COPY/kvevict/_install.py"
if ! (cd "$D" && "$PY" -m pip install --quiet --no-build-isolation --no-index --no-deps \
        --disable-pip-version-check --target "$D/site2" "$COPY") >"$D/pip2.log" 2>&1; then
    cat "$D/pip2.log" >&2
    fail "pip install of $COPY failed"
fi
for where in "$COPY" "$D/site2"; do
    if (cd "$D" && env -u KVEVICT_LIBRARY -u PKG_CONFIG_PATH PYTHONPATH="$where" \
            "$PY" smoke.py "$LIBDIR" "$VERSION" "$where") >"$D/self.log" 2>&1; then
        cat "$D/self.log"
    else
        cat "$D/self.log" >&2
        fail "the package at $where does not find the installed library by itself"
    fi
done
mv "$D/prefix" "$D/moved"
if (cd "$D" && env -u KVEVICT_LIBRARY -u PKG_CONFIG_PATH \
        PYTHONPATH="$D/moved/share/kvevict/python" "$PY" smoke.py "$D/moved/${LIBDIR#"$D/prefix/"}" \
        "$VERSION" "$D/moved/share/kvevict/python") >"$D/moved.log" 2>&1; then
    cat "$D/moved.log"
else
    cat "$D/moved.log" >&2
    fail "the installed copy does not find the library after the prefix moved"
fi
mv "$D/moved" "$D/prefix"

# Without KVEVICT_LIBRARY, pkg-config or ldconfig knowing the prefix: an
# ImportError that says what was tried (unless the system has a kvevict).
if ! PKG_CONFIG_PATH= pkg-config --exists kvevict-eval 2>/dev/null && ! ldconfig -p 2>/dev/null | grep -q libkvevict; then
    (cd "$D" && env -u KVEVICT_LIBRARY PYTHONPATH="$D/site" PKG_CONFIG_PATH= "$PY" -c "import kvevict") \
        >"$D/none.log" 2>&1 && fail "imported without any library to load"
    grep -q "ImportError: kvevict: cannot find libkvevict.*KVEVICT_LIBRARY" "$D/none.log" ||
        fail "no clear ImportError without a library: $(tail -1 "$D/none.log")"
fi
(cd "$D" && KVEVICT_LIBRARY="$D/absent.so" PYTHONPATH="$D/site" "$PY" -c "import kvevict") \
    >"$D/bad.log" 2>&1 && fail "imported with KVEVICT_LIBRARY naming no file"
grep -q "KVEVICT_LIBRARY=$D/absent.so" "$D/bad.log" ||
    fail "KVEVICT_LIBRARY naming no file: $(tail -1 "$D/bad.log")"
echo "test_python_install: $fails failures"
[ "$fails" -eq 0 ]
