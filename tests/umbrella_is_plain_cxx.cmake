# SPDX-License-Identifier: Apache-2.0
# The umbrella header bellows/bellows.hpp must include no .cuh and no MPI or NCCL header.
file(STRINGS ${INCLUDE_DIR}/bellows/bellows.hpp includes REGEX "^#include")
foreach(line IN LISTS includes)
  if(line MATCHES "\\.cuh\"" OR line MATCHES "mpi" OR line MATCHES "nccl")
    message(FATAL_ERROR "bellows/bellows.hpp must stay plain C++20, but has: ${line}")
  endif()
endforeach()
list(LENGTH includes count)
message(STATUS "bellows/bellows.hpp: ${count} includes, none needs nvcc or MPI")
