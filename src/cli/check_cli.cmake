# Runs one flashdec command line and checks its exit status and output
# (stdout and stderr together), for the CLI's CTests.
#   cmake -DEXE=path/to/flashdec "-DARGS=arg;arg" -DEXPECT_RC=N -DEXPECT=regex -P check_cli.cmake
execute_process(COMMAND ${EXE} ${ARGS} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
string(REPLACE ";" " " shown "${ARGS}")
message("$ flashdec ${shown}\n${out}${err}")
if(NOT rc STREQUAL "${EXPECT_RC}")
  message(FATAL_ERROR "flashdec ${shown}: exit status ${rc}, expected ${EXPECT_RC}")
endif()
if(NOT "${out}${err}" MATCHES "${EXPECT}")
  message(FATAL_ERROR "flashdec ${shown}: output does not match '${EXPECT}'")
endif()
