# SPDX-License-Identifier: Apache-2.0
# fmnist_mpi under mpirun prints the epochs of fmnist_demo's thread run with the same options:
# the same losses, accuracies, traffic and levels (the lines without their seconds).
# -DDEMO=... -DMPI_PROGRAM=... -DMPIEXEC=... -DNP=4 -DARGS="a;b;..." -DWORK_DIR=...
if(NOT DEFINED ENV{BELLOWS_FMNIST_DIR} AND NOT EXISTS /usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz)
  message(STATUS "skipped: no Fashion-MNIST (apt-get install dataset-fashion-mnist)")
  return()
endif()
file(REMOVE_RECURSE "${WORK_DIR}")
file(MAKE_DIRECTORY "${WORK_DIR}")
execute_process(COMMAND "${DEMO}" ${ARGS} --out "${WORK_DIR}/threads"
                RESULT_VARIABLE threads_status OUTPUT_VARIABLE threads_out ERROR_VARIABLE threads_err)
execute_process(COMMAND "${MPIEXEC}" --allow-run-as-root --oversubscribe -np ${NP} "${MPI_PROGRAM}" ${ARGS}
                        --out "${WORK_DIR}/ranks"
                RESULT_VARIABLE ranks_status OUTPUT_VARIABLE ranks_out ERROR_VARIABLE ranks_err)
if(NOT threads_status EQUAL 0 OR NOT ranks_status EQUAL 0)
  message(FATAL_ERROR "fmnist_demo: ${threads_status} ${threads_err}\nfmnist_mpi: ${ranks_status} ${ranks_err}")
endif()
foreach(side IN ITEMS threads ranks)
  string(REGEX MATCHALL "[^\n]*  epoch +[0-9]+/[0-9]+[^\n]*" lines "${${side}_out}")
  set(${side}_epochs "")
  foreach(line IN LISTS lines)
    string(REGEX REPLACE " +[0-9.]+ s$" "" line "${line}")
    string(APPEND ${side}_epochs "${line}\n")
  endforeach()
endforeach()
if(threads_epochs STREQUAL "")
  message(FATAL_ERROR "fmnist_demo printed no epochs:\n${threads_out}")
endif()
if(NOT threads_epochs STREQUAL ranks_epochs)
  message(FATAL_ERROR "the runs differ\nthreads:\n${threads_epochs}\nMPI ranks:\n${ranks_epochs}")
endif()
message(STATUS "the same epochs:\n${threads_epochs}")
file(REMOVE_RECURSE "${WORK_DIR}")
