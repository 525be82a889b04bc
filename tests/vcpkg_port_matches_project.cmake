# SPDX-License-Identifier: Apache-2.0
# The overlay port's version is the project's, it declares the cuda and mpi features, and its
# portfile builds one (release) configuration, installs the usage file and keeps vcpkg's
# post-build checks (no VCPKG_POLICY_EMPTY_PACKAGE: the package holds headers and CMake files).
file(READ ${PORT_JSON} json)
string(JSON name GET "${json}" name)
string(JSON version GET "${json}" version)
if(NOT name STREQUAL "bellows")
  message(FATAL_ERROR "ports/bellows/vcpkg.json names port '${name}', expected 'bellows'")
endif()
if(NOT version STREQUAL EXPECTED_VERSION)
  message(FATAL_ERROR "ports/bellows/vcpkg.json has version ${version}, CMake project has ${EXPECTED_VERSION}")
endif()
foreach(feature IN ITEMS cuda mpi)
  string(JSON description ERROR_VARIABLE missing GET "${json}" features ${feature} description)
  if(missing)
    message(FATAL_ERROR "ports/bellows/vcpkg.json does not declare feature '${feature}'")
  endif()
endforeach()
file(READ ${PORTFILE} portfile)
string(REGEX REPLACE "#[^\n]*" "" portfile "${portfile}")  # comments aside
foreach(rule IN ITEMS "set\\(VCPKG_BUILD_TYPE release\\)"
                      "file\\(INSTALL \"\\\${CMAKE_CURRENT_LIST_DIR}/usage\" DESTINATION \"\\\${CURRENT_PACKAGES_DIR}/share/\\\${PORT}\"\\)")
  if(NOT portfile MATCHES "${rule}")
    string(REPLACE "\\" "" line "${rule}")
    message(FATAL_ERROR "ports/bellows/portfile.cmake lacks ${line}")
  endif()
endforeach()
if(portfile MATCHES "VCPKG_POLICY_EMPTY_PACKAGE")
  message(FATAL_ERROR "ports/bellows/portfile.cmake sets VCPKG_POLICY_EMPTY_PACKAGE, which skips vcpkg's post-build checks")
endif()
message(STATUS "vcpkg port bellows ${version} matches the project; features cuda, mpi; release only, usage installed")
