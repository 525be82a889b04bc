# SPDX-License-Identifier: Apache-2.0
# cmake -DCOMPILER=... -DKIND=hpp|cuh -DINCLUDE_DIR=... -DWORK_DIR=... [-DEXTRA_INCLUDES=a;b]
#       [-DSKIP=bellows/x.hpp;...] [-DTOGETHER=ON] [-DEMULATION=dir] -P headers_self_contained.cmake
# Compiles a translation unit that includes one public header alone (twice, to catch a missing
# include guard), for every header of the kind, and fails listing those that do not compile.
# With TOGETHER, one translation unit includes them all: the compiler's warnings on every header
# for a second compiler, whose self-containment the first proved. With EMULATION (KIND=cuh), a
# host compiler parses the .cuh headers against the CUDA emulation in that directory
# (tests/emulation): their self-containment at about a third of nvcc's time per header, beside
# one nvcc translation unit of them all.
file(GLOB_RECURSE headers RELATIVE ${INCLUDE_DIR} ${INCLUDE_DIR}/bellows/*.${KIND})
if(SKIP)
  list(REMOVE_ITEM headers ${SKIP})
endif()
set(extra "")
foreach(dir IN LISTS EXTRA_INCLUDES)
  list(APPEND extra -isystem ${dir})
endforeach()
file(MAKE_DIRECTORY ${WORK_DIR})
if(KIND STREQUAL "cuh" AND EMULATION)
  # nvcc's pragmas (unroll, diagnostics) mean nothing to the host compiler
  set(flags -std=c++20 -Wall -Wextra -Wpedantic -Werror -Wno-unknown-pragmas -fsyntax-only -isystem ${EMULATION})
  set(ext cpp)
elseif(KIND STREQUAL "cuh")
  # -cuda: nvcc's two front ends (cudafe++ for the host side, cicc for the device) parse the
  # header, and nothing is compiled further: a third faster than -c, and whatever the header
  # instantiates is compiled by the tests that include it.
  set(flags -std=c++20 -arch=sm_80 -Xcompiler=-Wall,-Wextra -Werror=all-warnings -cuda)
  set(ext cu)
else()
  set(flags -std=c++20 -Wall -Wextra -Wpedantic -Werror -fsyntax-only)
  set(ext cpp)
endif()
set(failed "")
list(LENGTH headers count)
if(TOGETHER)
  set(tu ${WORK_DIR}/all.${ext})
  set(content "")
  foreach(h IN LISTS headers)
    string(APPEND content "#include \"${h}\"\n")
  endforeach()
  file(WRITE ${tu} "${content}int main() { return 0; }\n")
  execute_process(COMMAND ${COMPILER} ${flags} -I${INCLUDE_DIR} ${extra} ${tu} -o ${WORK_DIR}/all.o
                  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "the .${KIND} headers together do not compile with ${COMPILER}:\n${out}")
  endif()
  message(STATUS "${count} .${KIND} headers compile together with ${COMPILER}")
  return()
endif()
foreach(h IN LISTS headers)
  string(MAKE_C_IDENTIFIER "${h}" id)
  set(tu ${WORK_DIR}/${id}.${ext})
  file(WRITE ${tu} "#include \"${h}\"\n#include \"${h}\"\nint main() { return 0; }\n")
  execute_process(COMMAND ${COMPILER} ${flags} -I${INCLUDE_DIR} ${extra} ${tu} -o ${WORK_DIR}/${id}.o
                  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
  if(NOT rc EQUAL 0)
    message("${h} does not compile alone:\n${out}")
    list(APPEND failed ${h})
  endif()
endforeach()
if(failed)
  message(FATAL_ERROR "headers that are not self-contained with ${COMPILER}: ${failed}")
endif()
message(STATUS "${count} .${KIND} headers compile alone with ${COMPILER}")
