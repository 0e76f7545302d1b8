# Writes OUT (a C header defining BLOOMGRID_VERSION) from the project version
# and, in a git checkout, `git describe`; rewritten only when it changes, so
# a build after a new commit relinks with the new version and nothing else.
# Inputs: -DOUT=... -DPROJECT_VERSION=... -DSRC=... (the source tree),
# -DDESCRIBE=... (given: used instead of git, for trees without .git).
set(v "${PROJECT_VERSION}")
find_program(GIT git)
if(NOT "${DESCRIBE}" STREQUAL "")
  set(v "${PROJECT_VERSION} (${DESCRIBE})")
elseif(GIT AND EXISTS "${SRC}/.git")
  execute_process(COMMAND ${GIT} -C "${SRC}" describe --always --dirty --abbrev=12
                  OUTPUT_VARIABLE d OUTPUT_STRIP_TRAILING_WHITESPACE
                  ERROR_QUIET RESULT_VARIABLE rc)
  if(rc EQUAL 0 AND NOT d STREQUAL "")
    set(v "${PROJECT_VERSION} (${d})")
  endif()
endif()
set(text "#define BLOOMGRID_VERSION \"${v}\"\n")
if(EXISTS "${OUT}")
  file(READ "${OUT}" old)
else()
  set(old "")
endif()
if(NOT old STREQUAL text)
  file(WRITE "${OUT}" "${text}")
endif()
