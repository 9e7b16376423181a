# rdmacc_runpath(TARGET DESTINATION RUNPATH): a target installed with a
# RUNPATH (RUNPATH relative to $ORIGIN, DESTINATION the install(TARGETS)
# destination, relative to the prefix) gets a build-tree RUNPATH without an
# empty element.
#
# Why by hand: for a target whose installed RUNPATH differs from its build
# tree's, CMake appends ':' padding to the build-tree one, always at least one
# (so that `cmake --install` can rewrite the string in place, and the linker
# does not merge it with a symbol name). The dynamic loader reads an empty
# element as the current directory: a build-tree rdmacc-perf started in a
# directory holding a libfmt.so.9 loads that file. Here the build tree gets
# the build directory and, as the room for the installed RUNPATH, a directory
# inside the build directory that is never created; the install rewrites both.
function(rdmacc_runpath target destination runpath)
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
  install(CODE "file(RPATH_CHANGE
    FILE \"\$ENV{DESTDIR}\${CMAKE_INSTALL_PREFIX}/${destination}/$<TARGET_FILE_NAME:${target}>\"
    OLD_RPATH \"${build_runpath}\" NEW_RPATH \"${runpath}\")")
endfunction()
