# Writes version.cpp with the commit the build is made from, "-dirty" where tracked files differ
# from it; run at every build (lib/CMakeLists.txt), so a binary built after a commit or an edit
# names that code and not the code at configure time. configure_file rewrites OUT only when its
# text changes: an unchanged commit recompiles nothing.
#   cmake -DSRC=<source dir> -DIN=<version.cpp.in> -DOUT=<version.cpp> -DPROJECT_VERSION=<v>
#         -P version.cmake
execute_process(COMMAND git rev-parse --short=12 HEAD WORKING_DIRECTORY ${SRC}
                OUTPUT_VARIABLE DTRAIN_GIT_SHA OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET
                RESULT_VARIABLE rc)
if(NOT rc EQUAL 0 OR NOT DTRAIN_GIT_SHA)
  set(DTRAIN_GIT_SHA "unknown")  # a tree without git (a copied source folder)
else()
  execute_process(COMMAND git --no-optional-locks status --porcelain --untracked-files=no
                  WORKING_DIRECTORY ${SRC}
                  OUTPUT_VARIABLE changed OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
  if(changed)
    string(APPEND DTRAIN_GIT_SHA "-dirty")
  endif()
endif()
configure_file(${IN} ${OUT} @ONLY)
