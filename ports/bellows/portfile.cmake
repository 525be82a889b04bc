# SPDX-License-Identifier: Apache-2.0
# Overlay port for a local checkout: vcpkg install bellows --overlay-ports=<checkout>/ports
set(SOURCE_PATH "${CMAKE_CURRENT_LIST_DIR}/../..")
# Headers only: one (release) configuration installs everything; a debug one would be the same.
set(VCPKG_BUILD_TYPE release)

vcpkg_check_features(OUT_FEATURE_OPTIONS feature_options
  FEATURES
    cuda BELLOWS_ENABLE_CUDA
    mpi  BELLOWS_ENABLE_MPI)

vcpkg_cmake_configure(
  SOURCE_PATH "${SOURCE_PATH}"
  OPTIONS
    ${feature_options}
    -DBELLOWS_BUILD_TESTS=OFF
    -DBELLOWS_BUILD_BENCHMARKS=OFF
    -DBELLOWS_BUILD_EXAMPLES=OFF)
vcpkg_cmake_install()
vcpkg_cmake_config_fixup(CONFIG_PATH lib/cmake/bellows)

# Headers only: the CMake files moved to share/bellows, which leaves lib/ empty.
file(REMOVE_RECURSE "${CURRENT_PACKAGES_DIR}/lib")
file(INSTALL "${CMAKE_CURRENT_LIST_DIR}/usage" DESTINATION "${CURRENT_PACKAGES_DIR}/share/${PORT}")
vcpkg_install_copyright(FILE_LIST "${SOURCE_PATH}/LICENSE")
