# `docs` target: Doxygen over the public header, every warning an error, so an
# undocumented or mis-documented declaration fails the build of the docs.
find_package(Doxygen QUIET)
if(DOXYGEN_FOUND)
  set(FLASHDEC_DOXYGEN_INPUT ${PROJECT_SOURCE_DIR}/include/flashdec.h)
  set(FLASHDEC_DOXYGEN_OUTPUT ${PROJECT_BINARY_DIR}/docs)
  configure_file(${PROJECT_SOURCE_DIR}/docs/Doxyfile.in ${PROJECT_BINARY_DIR}/Doxyfile @ONLY)
  add_custom_target(docs
    COMMAND ${CMAKE_COMMAND} -E make_directory ${FLASHDEC_DOXYGEN_OUTPUT}
    COMMAND Doxygen::doxygen ${PROJECT_BINARY_DIR}/Doxyfile
    WORKING_DIRECTORY ${PROJECT_SOURCE_DIR}
    DEPENDS ${FLASHDEC_DOXYGEN_INPUT} ${PROJECT_SOURCE_DIR}/docs/Doxyfile.in
    COMMENT "Doxygen: API reference in ${FLASHDEC_DOXYGEN_OUTPUT}/html"
    VERBATIM)
else()
  add_custom_target(docs
    COMMAND ${CMAKE_COMMAND} -E echo "doxygen not found: install it (apt-get install doxygen)"
    COMMAND ${CMAKE_COMMAND} -E false
    VERBATIM)
endif()
