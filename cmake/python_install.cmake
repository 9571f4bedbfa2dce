# SPDX-License-Identifier: MIT
# The Python binding installed beside the library it loads:
# PREFIX/share/kvevict/python (a copy of python/, pip-installable from there),
# with kvevict/_install.py written at install time to record where the
# library is: relative to the package, so that a moved prefix still works,
# and as an absolute path, which a `pip install` of that copy carries to
# wherever it puts the package (python/kvevict/_lib.py reads both).
set(KVE_PY_DIR ${CMAKE_INSTALL_DATADIR}/kvevict/python)
install(DIRECTORY python/ DESTINATION ${KVE_PY_DIR}
  PATTERN __pycache__ EXCLUDE PATTERN "*.egg-info" EXCLUDE PATTERN build EXCLUDE
  PATTERN _install.py EXCLUDE)
if(IS_ABSOLUTE "${CMAKE_INSTALL_LIBDIR}" OR IS_ABSOLUTE "${KVE_PY_DIR}")
  set(kve_py_rel "")
else()
  file(RELATIVE_PATH kve_py_rel "/prefix/${KVE_PY_DIR}/kvevict" "/prefix/${CMAKE_INSTALL_LIBDIR}")
endif()
if(IS_ABSOLUTE "${CMAKE_INSTALL_LIBDIR}")
  set(kve_py_abs "${CMAKE_INSTALL_LIBDIR}")
else()
  set(kve_py_abs "\${CMAKE_INSTALL_PREFIX}/${CMAKE_INSTALL_LIBDIR}")
endif()
if(IS_ABSOLUTE "${KVE_PY_DIR}")
  set(kve_py_at "\$ENV{DESTDIR}${KVE_PY_DIR}")
else()
  set(kve_py_at "\$ENV{DESTDIR}\${CMAKE_INSTALL_PREFIX}/${KVE_PY_DIR}")
endif()
install(CODE "
  file(WRITE \"${kve_py_at}/kvevict/_install.py\"
\"# SPDX-License-Identifier: MIT
# Written by cmake --install: where the library of this installation is.
LIBDIR_FROM_PACKAGE = '${kve_py_rel}'
LIBDIR = '${kve_py_abs}'
\")")
