# ABI and packaging tests (included by tests/CMakeLists.txt). Each is a script
# under tests/scripts, labelled "abi" or "package"; the cmocka ABI suites
# (test_abi_layout.c, test_status.c) are picked up by the test_* glob.
set(FLASHDEC_TEST_SCRIPTS ${CMAKE_CURRENT_SOURCE_DIR}/scripts)

# (a) Exported symbols of libflashdec.so == FD_API declarations of the header.
add_test(NAME abi_exports
  COMMAND bash ${FLASHDEC_TEST_SCRIPTS}/check_exports.sh ${CMAKE_C_COMPILER}
          $<TARGET_FILE:flashdec> ${PROJECT_SOURCE_DIR}/include/flashdec.h)
# ... and that check really rejects mismatches.
add_test(NAME abi_exports_selftest
  COMMAND bash ${FLASHDEC_TEST_SCRIPTS}/check_exports_selftest.sh ${CMAKE_C_COMPILER}
          ${PROJECT_SOURCE_DIR}/src/flashdec.map)

# (b) The header on its own: strict C99 and C++17, no CUDA header, C linkage.
add_test(NAME abi_header_c99
  COMMAND bash ${FLASHDEC_TEST_SCRIPTS}/check_header.sh c99 ${CMAKE_C_COMPILER}
          ${PROJECT_SOURCE_DIR}/include)
add_test(NAME abi_header_cxx17
  COMMAND bash ${FLASHDEC_TEST_SCRIPTS}/check_header.sh c++17 ${CMAKE_CXX_COMPILER}
          ${PROJECT_SOURCE_DIR}/include)
set_tests_properties(abi_exports abi_exports_selftest abi_header_c99 abi_header_cxx17
  PROPERTIES LABELS abi TIMEOUT 120)

# (c) Every document cited in the header, sources, scripts and docs exists in
# the repository (docs/semantics.md, docs/abi.md, ...), and the check can fail.
add_test(NAME docs_links
  COMMAND bash ${FLASHDEC_TEST_SCRIPTS}/check_doc_links.sh ${PROJECT_SOURCE_DIR})
add_test(NAME docs_links_selftest
  COMMAND bash ${FLASHDEC_TEST_SCRIPTS}/check_doc_links.sh --selftest)
set_tests_properties(docs_links docs_links_selftest PROPERTIES LABELS "abi;docs" TIMEOUT 120)

# (d) tests/abi_layout_expected.h (the table test_abi_layout checks) is
# current, and the ABI only grew by appending since bindings/abi/baseline.txt
# (bindings/tools/gen_bindings.py; skipped without Python 3 + pycparser).
find_package(Python3 COMPONENTS Interpreter QUIET)
if(Python3_Interpreter_FOUND)
  add_test(NAME abi_baseline
    COMMAND ${Python3_EXECUTABLE} ${PROJECT_SOURCE_DIR}/bindings/tools/gen_bindings.py --check --abi-only)
  set_tests_properties(abi_baseline PROPERTIES LABELS abi TIMEOUT 120 SKIP_RETURN_CODE 77)
  # (e) The kernel tooling's SASS loop counter (scripts/sass_loops.py,
  # docs/benchmarks.md) on a hand-written listing.
  add_test(NAME tools_sass_loops
    COMMAND bash ${FLASHDEC_TEST_SCRIPTS}/check_sass_loops.sh ${Python3_EXECUTABLE}
            ${PROJECT_SOURCE_DIR})
  set_tests_properties(tools_sass_loops PROPERTIES LABELS docs TIMEOUT 60)
endif()

# Packaging: install into a temporary prefix, then build tests/consumer with
# find_package(flashdec) and with pkg-config; the consumers and the installed
# flashdec CLI must run with LD_LIBRARY_PATH unset (their RUNPATH finds it).
set(flashdec_consumer_flags "")
if(FLASHDEC_SANITIZE)
  set(flashdec_consumer_flags "-fsanitize=address,undefined")
endif()
foreach(mode cmake pkg-config)
  add_test(NAME package_consumer_${mode}
    COMMAND bash ${FLASHDEC_TEST_SCRIPTS}/check_install.sh ${mode} ${CMAKE_COMMAND} ${PROJECT_BINARY_DIR}
            ${PROJECT_SOURCE_DIR} ${CMAKE_CURRENT_BINARY_DIR}/package-${mode}
            ${CMAKE_INSTALL_LIBDIR} ${PROJECT_VERSION} ${CMAKE_C_COMPILER} ${CMAKE_GENERATOR}
            "${flashdec_consumer_flags}")
  # Both install the same build tree (cmake --install writes install_manifest.txt
  # there), so they take turns.
  set_tests_properties(package_consumer_${mode} PROPERTIES LABELS package TIMEOUT 300
    RESOURCE_LOCK flashdec_install_manifest SKIP_RETURN_CODE 77)
endforeach()

# test_status.c starts threads to check that the last error is per thread.
if(TARGET test_status)
  target_link_libraries(test_status PRIVATE Threads::Threads)
endif()

# The example runs end to end (short) in every build, sanitizers included.
if(TARGET decode_demo)
  add_test(NAME example_decode_demo COMMAND decode_demo --steps 24 --batch 4 --seed 7)
  set_tests_properties(example_decode_demo PROPERTIES LABELS example TIMEOUT 300)
endif()
if(TARGET speculative_demo)
  add_test(NAME example_speculative_demo COMMAND speculative_demo --draft 3 --seed 5)
  set_tests_properties(example_speculative_demo PROPERTIES LABELS example TIMEOUT 120)
endif()

# The multi-thread suites also carry the label "threads" (the ThreadSanitizer
# CI step runs -L threads).
if(TARGET test_thread_stress AND TARGET test_status)
  set_tests_properties(test_thread_stress test_status PROPERTIES LABELS "api;threads")
endif()
if(TARGET unit_thread_pool)
  set_tests_properties(unit_thread_pool PROPERTIES LABELS "unit;threads")
endif()
