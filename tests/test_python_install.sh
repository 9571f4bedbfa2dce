#!/bin/sh
# SPDX-License-Identifier: MIT
# test_python_install.sh CMAKE BUILD_DIR SOURCE_DIR PYTHON - the Python package
# installed the way docs/python.md says, with the commands of its install
# block run as the page writes them (read from the page, so it cannot
# drift): `cmake --install` of the build to a temporary prefix (for
# /usr/local), then a virtual environment (for ~/.venvs/kvevict) made with
# `PYTHON -m venv --system-site-packages` and `pip install
# --no-build-isolation --no-index` of the installed copy into it, with the
# network cut off (unshare -n) where the machine lets it: Debian's numpy,
# setuptools and wheel, nothing downloaded, pip's cache in the scratch
# directory. The environment's python, with no environment variable,
# imports the package and finds the installed library (the prefix it
# recorded). Then a copy of python/ pip-installed into a temporary target,
# imported outside the source tree with KVEVICT_LIBRARY unset, must find
# the installed library through pkg-config (PKG_CONFIG_PATH=PREFIX/lib/
# pkgconfig), report the CMake version, and evaluate a policy; without that
# hint, it must fail to import with a message naming what it tried. The
# copy `cmake --install` puts in PREFIX/share/kvevict/python finds the
# library by itself, imported where it is and after the prefix is moved
# (the relative path it recorded). Exit 77 (skipped, reason printed) when
# PYTHON lacks numpy, pip, setuptools, wheel or venv's ensurepip, or
# pkg-config is missing.
set -u
CMAKE=${1:?usage: test_python_install.sh CMAKE BUILD_DIR SOURCE_DIR PYTHON}
BUILD=${2:?}
SRC=${3:?}
PY=${4:?}
for need in numpy pip setuptools wheel ensurepip; do
    if ! "$PY" -c "import $need" >/dev/null 2>&1; then
        pkg=python3-$need
        [ "$need" = ensurepip ] && pkg=python3-venv
        echo "SKIP: $PY cannot import $need (Debian: apt-get install $pkg)"
        exit 77
    fi
done
if ! command -v pkg-config >/dev/null 2>&1; then
    echo "SKIP: pkg-config is not installed (apt-get install pkgconf)"
    exit 77
fi
. "$(dirname "$0")/check.sh"
scratch kvevict-pyinstall

VERSION=$(sed -n 's/^project(kvevict VERSION \([0-9.]*\) .*/\1/p' "$SRC/CMakeLists.txt")

# docs/python.md's install block, as written: the sh block after its
# "python-install" marker. Its first line builds (this build is made); the
# others run with this build for `build`, a temporary prefix for /usr/local
# and a temporary environment for ~/.venvs/kvevict.
awk '/^<!-- python-install:/ { m = 1; next }
     m && /^```sh$/ { b = 1; next }
     b && /^```$/ { exit }
     b { print }' "$SRC/docs/python.md" >"$D/block"
pip_line='~/.venvs/kvevict/bin/python -m pip install --no-build-isolation --no-index'
pip_line="$pip_line /usr/local/share/kvevict/python"
if [ "$(wc -l <"$D/block")" -ne 4 ] ||
   ! sed -n 1p "$D/block" | grep -q '^cmake -S . -B build .*cmake --build build' ||
   ! sed -n 2p "$D/block" | grep -q '^cmake --install build --prefix /usr/local ' ||
   ! grep -q -- '-m venv --system-site-packages ~/.venvs/kvevict$' "$D/block" ||
   ! grep -q -- "^$pip_line\$" "$D/block"; then
    fail "docs/python.md's install block is not the four lines this test knows how to run:"
    cat "$D/block" >&2
    exit 1
fi
sed -n '2,$p' "$D/block" | sed -e "s|^cmake --install build |\"$CMAKE\" --install \"$BUILD\" |" \
    -e "s|/usr/local|$D/prefix|g" -e "s|~/.venvs/kvevict|$D/venv|g" \
    -e "s|^/usr/bin/python3 |\"$PY\" |" >"$D/install.sh"
if grep -q '/usr/local\|~/' "$D/install.sh"; then
    fail "the install lines still name a place outside the scratch directory: $(cat "$D/install.sh")"
    exit 1
fi
offline="" # the network cut off where the machine lets this user do it
if unshare -n true 2>/dev/null; then
    offline="unshare -n"
elif unshare -rn true 2>/dev/null; then
    offline="unshare -rn"
fi
# shellcheck disable=SC2086
if ! (cd "$D" && env -u PYTHONPATH -u VIRTUAL_ENV -u PIP_INDEX_URL -u PIP_FIND_LINKS \
        PIP_CACHE_DIR="$D/pip-cache" PIP_DISABLE_PIP_VERSION_CHECK=1 \
        $offline sh -ex "$D/install.sh") >"$D/install.log" 2>&1; then
    cat "$D/install.log" >&2
    fail "docs/python.md's install commands failed${offline:+ offline ($offline)}"
    exit 1
fi
echo "test_python_install: docs/python.md's install commands ran${offline:+ with no network ($offline)}"
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
# The installed copy: no KVEVICT_LIBRARY, no PKG_CONFIG_PATH, imported in
# place and from the environment the documented commands installed it into.
COPY="$D/prefix/share/kvevict/python"
[ -f "$COPY/kvevict/_install.py" ] || fail "cmake --install wrote no $COPY/kvevict/_install.py"
if (cd "$D" && env -u KVEVICT_LIBRARY -u PKG_CONFIG_PATH PYTHONPATH="$COPY" \
        "$PY" smoke.py "$LIBDIR" "$VERSION" "$COPY") >"$D/self.log" 2>&1; then
    cat "$D/self.log"
else
    cat "$D/self.log" >&2
    fail "the package at $COPY does not find the installed library by itself"
fi
if (cd "$D" && env -u KVEVICT_LIBRARY -u PKG_CONFIG_PATH -u PYTHONPATH \
        "$D/venv/bin/python" smoke.py "$LIBDIR" "$VERSION" "$D/venv/") >"$D/venv.log" 2>&1; then
    cat "$D/venv.log"
else
    cat "$D/venv.log" >&2
    fail "the package pip installed into $D/venv does not find the installed library by itself"
fi
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
