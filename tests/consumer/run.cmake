# SPDX-License-Identifier: Apache-2.0
# Configures, builds and runs the consumer project in one of four modes:
# build_tree, install_tree (installs bellows first), add_subdirectory, fetchcontent.
file(REMOVE_RECURSE ${WORK_DIR})
set(args -G ${GENERATOR} -DCMAKE_CXX_COMPILER=${CXX} -DMODE=${MODE}
         -DBELLOWS_SOURCE_DIR=${BELLOWS_SOURCE_DIR})
if(MODE STREQUAL "build_tree")
  list(APPEND args -Dbellows_DIR=${BELLOWS_BINARY_DIR})
elseif(MODE STREQUAL "install_tree")
  execute_process(COMMAND ${CMAKE_COMMAND} --install ${BELLOWS_BINARY_DIR}
                          --prefix ${WORK_DIR}/prefix
                  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "installing bellows failed:\n${out}")
  endif()
  list(APPEND args -DCMAKE_PREFIX_PATH=${WORK_DIR}/prefix)
endif()
foreach(step IN ITEMS configure build run)
  if(step STREQUAL "configure")
    set(cmd ${CMAKE_COMMAND} -S ${CONSUMER_SOURCE} -B ${WORK_DIR}/build ${args})
  elseif(step STREQUAL "build")
    set(cmd ${CMAKE_COMMAND} --build ${WORK_DIR}/build)
  else()
    set(cmd ${WORK_DIR}/build/consumer)
  endif()
  execute_process(COMMAND ${cmd} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "consumer (${MODE}) failed to ${step}:\n${out}")
  endif()
endforeach()
message(STATUS "consumer (${MODE}): ${out}")
