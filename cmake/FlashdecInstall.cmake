# Install rules, CMake package config and pkg-config file for libflashdec.
#
# A consumer gets the shared library (with its SONAME symlinks), the one public
# header, and either `find_package(flashdec)` + `flashdec::flashdec` or
# `pkg-config --cflags --libs flashdec`. Both descriptions are relocatable: they
# locate the prefix from their own path, so `cmake --install --prefix DIR`
# yields a working tree anywhere.
include(CMakePackageConfigHelpers)

set(FLASHDEC_CMAKE_INSTALL_DIR ${CMAKE_INSTALL_LIBDIR}/cmake/flashdec)

# The CUDA runtime is linked statically and hidden, so the installed target has
# no link dependency of its own: consumers need neither CUDA nor Threads.
install(TARGETS flashdec EXPORT flashdecTargets
  LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR} COMPONENT runtime NAMELINK_COMPONENT development
  RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR} COMPONENT runtime
  INCLUDES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(FILES ${PROJECT_SOURCE_DIR}/include/flashdec.h
  DESTINATION ${CMAKE_INSTALL_INCLUDEDIR} COMPONENT development)
install(EXPORT flashdecTargets NAMESPACE flashdec:: FILE flashdecTargets.cmake
  DESTINATION ${FLASHDEC_CMAKE_INSTALL_DIR} COMPONENT development)

# Installed programs (the flashdec CLI) find the library through a RUNPATH
# relative to themselves, so a relocated prefix needs no LD_LIBRARY_PATH.
# src/cli applies it to its target.
file(RELATIVE_PATH FLASHDEC_BIN_TO_LIB /prefix/${CMAKE_INSTALL_BINDIR} /prefix/${CMAKE_INSTALL_LIBDIR})
set(FLASHDEC_INSTALL_BIN_RPATH "$ORIGIN/${FLASHDEC_BIN_TO_LIB}")

configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/flashdecConfig.cmake.in
  ${PROJECT_BINARY_DIR}/flashdecConfig.cmake
  INSTALL_DESTINATION ${FLASHDEC_CMAKE_INSTALL_DIR})
# Same rule as the header's runtime check and the SONAME: before 1.0 the major
# and minor versions must be equal (find_package(flashdec 0.2) takes 0.2.x,
# never 0.1 or 0.3); from 1.0 on the major version, and at least the requested
# minor.
# FLASHDEC_SOVERSION (CMakeLists.txt) is major.minor or the major alone.
if(FLASHDEC_SOVERSION STREQUAL PROJECT_VERSION_MAJOR)
  set(FLASHDEC_PACKAGE_COMPATIBILITY SameMajorVersion)
else()
  set(FLASHDEC_PACKAGE_COMPATIBILITY SameMinorVersion)
endif()
write_basic_package_version_file(${PROJECT_BINARY_DIR}/flashdecConfigVersion.cmake
  VERSION ${PROJECT_VERSION} COMPATIBILITY ${FLASHDEC_PACKAGE_COMPATIBILITY})
install(FILES ${PROJECT_BINARY_DIR}/flashdecConfig.cmake
  ${PROJECT_BINARY_DIR}/flashdecConfigVersion.cmake
  DESTINATION ${FLASHDEC_CMAKE_INSTALL_DIR} COMPONENT development)

# pkg-config: the prefix is derived from ${pcfiledir}, so the file stays right
# when the install prefix is chosen at install time. Libs carries
# -Wl,-rpath,${libdir}: a program linked with these flags runs without
# LD_LIBRARY_PATH (cgo's `#cgo pkg-config: flashdec` relies on it too).
set(FLASHDEC_PC_DIR ${CMAKE_INSTALL_LIBDIR}/pkgconfig)
if(IS_ABSOLUTE "${CMAKE_INSTALL_LIBDIR}" OR IS_ABSOLUTE "${CMAKE_INSTALL_INCLUDEDIR}")
  message(FATAL_ERROR "flashdec: CMAKE_INSTALL_LIBDIR and CMAKE_INSTALL_INCLUDEDIR must be "
                      "relative to the prefix (the pkg-config file is relocatable)")
endif()
file(RELATIVE_PATH FLASHDEC_PC_TO_PREFIX /prefix/${FLASHDEC_PC_DIR} /prefix)
string(REGEX REPLACE "/$" "" FLASHDEC_PC_TO_PREFIX "${FLASHDEC_PC_TO_PREFIX}")
configure_file(${PROJECT_SOURCE_DIR}/cmake/flashdec.pc.in ${PROJECT_BINARY_DIR}/flashdec.pc @ONLY)
install(FILES ${PROJECT_BINARY_DIR}/flashdec.pc DESTINATION ${FLASHDEC_PC_DIR}
  COMPONENT development)
