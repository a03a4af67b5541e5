# `docs` target: Doxygen over the public header, every warning an error, so an
# undocumented or mis-documented declaration fails the build of the docs.
find_package(Doxygen QUIET)
if(DOXYGEN_FOUND)
  # The header, the main page (docs/index.md) and the docs pages as related
  # pages. Every page listed here must build without a warning.
  set(flashdec_doc_pages index semantics abi benchmarks architecture engine cuda-streams
      kernel-design testing transformers)
  set(flashdec_doc_files ${PROJECT_SOURCE_DIR}/include/flashdec.h)
  foreach(page ${flashdec_doc_pages})
    list(APPEND flashdec_doc_files ${PROJECT_SOURCE_DIR}/docs/${page}.md)
  endforeach()
  list(JOIN flashdec_doc_files "\" \"" FLASHDEC_DOXYGEN_INPUT)
  set(FLASHDEC_DOXYGEN_INPUT "\"${FLASHDEC_DOXYGEN_INPUT}\"")
  set(FLASHDEC_DOXYGEN_MAINPAGE ${PROJECT_SOURCE_DIR}/docs/index.md)
  set(FLASHDEC_DOXYGEN_OUTPUT ${PROJECT_BINARY_DIR}/docs)
  configure_file(${PROJECT_SOURCE_DIR}/docs/Doxyfile.in ${PROJECT_BINARY_DIR}/Doxyfile @ONLY)
  add_custom_target(docs
    COMMAND ${CMAKE_COMMAND} -E make_directory ${FLASHDEC_DOXYGEN_OUTPUT}
    COMMAND Doxygen::doxygen ${PROJECT_BINARY_DIR}/Doxyfile
    WORKING_DIRECTORY ${PROJECT_SOURCE_DIR}
    DEPENDS ${flashdec_doc_files} ${PROJECT_SOURCE_DIR}/docs/Doxyfile.in
    COMMENT "Doxygen: API reference in ${FLASHDEC_DOXYGEN_OUTPUT}/html"
    VERBATIM)
else()
  add_custom_target(docs
    COMMAND ${CMAKE_COMMAND} -E echo "doxygen not found: install it (apt-get install doxygen)"
    COMMAND ${CMAKE_COMMAND} -E false
    VERBATIM)
endif()
