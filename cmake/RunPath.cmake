# Install destinations may be relative to the prefix or absolute (GNUInstallDirs
# allows both; Fedora's %cmake passes CMAKE_INSTALL_LIBDIR=/usr/lib64). These
# helpers take either, so that no caller joins a prefix and a directory itself.

# rdmacc_install_full(OUT DIR): DIR as an absolute path (at configure time).
function(rdmacc_install_full out dir)
  if(IS_ABSOLUTE "${dir}")
    set(full "${dir}")
  else()
    set(full "${CMAKE_INSTALL_PREFIX}/${dir}")
  endif()
  cmake_path(NORMAL_PATH full)
  string(REGEX REPLACE "(.)/$" "\\1" full "${full}")
  set(${out} "${full}" PARENT_SCOPE)
endfunction()

# rdmacc_install_runpath(OUT DESTINATION LIBDIR): the RUNPATH that makes a
# file installed in DESTINATION find the libraries installed in LIBDIR:
# $ORIGIN and the path between them, so that a prefix moved as a whole still
# works (when both are relative to it).
function(rdmacc_install_runpath out destination libdir)
  rdmacc_install_full(from "${destination}")
  rdmacc_install_full(to "${libdir}")
  file(RELATIVE_PATH relative "${from}" "${to}")
  if(relative STREQUAL "")
    set(${out} "$ORIGIN" PARENT_SCOPE)
  else()
    set(${out} "$ORIGIN/${relative}" PARENT_SCOPE)
  endif()
endfunction()

# rdmacc_runpath(TARGET DESTINATION LIBDIR): TARGET, installed to DESTINATION
# by its install(TARGETS), finds the libraries of LIBDIR when installed
# (rdmacc_install_runpath), and its build-tree RUNPATH has no empty element.
#
# Why by hand: for a target whose installed RUNPATH differs from its build
# tree's, CMake appends ':' padding to the build-tree one, always at least one
# (so that `cmake --install` can rewrite the string in place, and the linker
# does not merge it with a symbol name). The dynamic loader reads an empty
# element as the current directory: a build-tree rdmacc-perf started in a
# directory holding a libfmt.so.9 loads that file. Here the build tree gets
# the build directory and, as the room for the installed RUNPATH, a directory
# inside the build directory that is never created; the install rewrites both.
function(rdmacc_runpath target destination libdir)
  rdmacc_install_runpath(runpath "${destination}" "${libdir}")
  set(room "${PROJECT_BINARY_DIR}/.runpath-room")
  string(LENGTH "${PROJECT_BINARY_DIR}:${room}" have)
  string(LENGTH "${runpath}" need)
  while(have LESS need)
    string(APPEND room "-")
    math(EXPR have "${have} + 1")
  endwhile()
  set(build_runpath "${PROJECT_BINARY_DIR}:${room}")
  set_target_properties(${target} PROPERTIES SKIP_BUILD_RPATH ON)
  target_link_options(${target} PRIVATE "LINKER:-rpath,${build_runpath}")
  # Where install(TARGETS) put it: a relative destination follows the prefix
  # of the install (`cmake --install --prefix`), an absolute one does not.
  if(IS_ABSOLUTE "${destination}")
    set(installed "\$ENV{DESTDIR}${destination}")
  else()
    set(installed "\$ENV{DESTDIR}\${CMAKE_INSTALL_PREFIX}/${destination}")
  endif()
  install(CODE "file(RPATH_CHANGE
    FILE \"${installed}/$<TARGET_FILE_NAME:${target}>\"
    OLD_RPATH \"${build_runpath}\" NEW_RPATH \"${runpath}\")")
endfunction()
