# SPDX-License-Identifier: Apache-2.0
# fmnist_runs: the demo's comparison on threads (runs_threads.cpp), compiled once for fmnist_demo
# and the demo's tests, which would each compile it otherwise (40 s); fmnist_runs_mpi: the same
# over MPI (runs_mpi.cpp) for fmnist_mpi and its test. Included by examples/ and by tests/, so
# that the tests have it when the examples are off. A program built with FMNIST_CUDA (fmnist_demo
# --backend cuda) compiles its own comparison, which reaches the device.
include_guard(GLOBAL)
find_package(ZLIB REQUIRED)
add_library(fmnist_runs STATIC ${CMAKE_CURRENT_LIST_DIR}/runs_threads.cpp)
target_include_directories(fmnist_runs PUBLIC ${CMAKE_CURRENT_LIST_DIR}/..)
target_compile_definitions(fmnist_runs PUBLIC FMNIST_RUNS_LIBRARY=1)
target_link_libraries(fmnist_runs PUBLIC bellows::bellows ZLIB::ZLIB PRIVATE bellows_warnings)
if(TARGET bellows::mpi)
  add_library(fmnist_runs_mpi STATIC ${CMAKE_CURRENT_LIST_DIR}/runs_mpi.cpp)
  target_compile_definitions(fmnist_runs_mpi PUBLIC FMNIST_RUNS_LIBRARY_MPI=1)
  target_link_libraries(fmnist_runs_mpi PUBLIC fmnist_runs bellows::mpi PRIVATE bellows_warnings)
endif()
