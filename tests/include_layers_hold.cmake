# SPDX-License-Identifier: Apache-2.0
# The layers of include/bellows hold: every `#include "bellows/..."` of a header is allowed by
# the rules below, so the folders say what depends on what (docs/layout.md draws the graph).
#   core/                      includes only core/
#   plan/ (backend-neutral)    includes only core/ and plan/
#   concepts.hpp               includes only core/ and plan/
#   cpu/, cuda/ (the kernels)  include only core/, plan/, concepts.hpp and their own folder:
#                              never each other, never anything above them
#   compressors/*_types.hpp,   include only core/ and plan/ (parameter structs stay light)
#   regime/*_types.hpp
#   feedback/                  the layers below, and feedback/
#   compressors/               the layers below, feedback/ and compressors/
#   regime/                    the layers below (not compressors/ nor feedback/), and regime/
#   collectives/               the layers below (not compressors/, feedback/ nor regime/), and collectives/
#   sync/                      any folder (the top), not the umbrella bellows.hpp
# (the layers below: core/, plan/, concepts.hpp, cpu/ and cuda/). Every header but the umbrella
# is checked, so an include that runs up fails wherever it is.
# A header breaking a rule is printed with its line; the test fails if there is any.
# Usage: cmake -DINCLUDE_DIR=<repository>/include -P include_layers_hold.cmake
cmake_minimum_required(VERSION 3.21)
if(NOT INCLUDE_DIR)
  message(FATAL_ERROR "include_layers_hold: pass -DINCLUDE_DIR=<repository>/include")
endif()

file(GLOB_RECURSE headers RELATIVE "${INCLUDE_DIR}/bellows" "${INCLUDE_DIR}/bellows/*.hpp"
     "${INCLUDE_DIR}/bellows/*.cuh")
list(SORT headers)
set(broken 0)
set(checked 0)
foreach(header IN LISTS headers)
  set(below "core/|plan/|concepts\\.hpp|cpu/|cuda/")
  set(allowed "")
  if(header MATCHES "^core/")
    set(allowed "core/")
  elseif(header MATCHES "^plan/" OR header STREQUAL "concepts.hpp" OR header MATCHES "_types\\.hpp$")
    set(allowed "core/|plan/")
  elseif(header MATCHES "^cpu/")
    set(allowed "core/|plan/|concepts\\.hpp|cpu/")
  elseif(header MATCHES "^cuda/")
    set(allowed "core/|plan/|concepts\\.hpp|cuda/")
  elseif(header MATCHES "^feedback/")
    set(allowed "${below}|feedback/")
  elseif(header MATCHES "^compressors/")
    set(allowed "${below}|feedback/|compressors/")
  elseif(header MATCHES "^regime/")
    set(allowed "${below}|regime/")
  elseif(header MATCHES "^collectives/")
    set(allowed "${below}|collectives/")
  elseif(header MATCHES "^sync/")
    set(allowed "${below}|feedback/|compressors/|regime/|collectives/|sync/")
  elseif(header STREQUAL "bellows.hpp")
    continue()  # the umbrella includes every layer
  else()
    message(STATUS "include_layers_hold: ${header} is in no layer; add a rule for its folder")
    math(EXPR broken "${broken} + 1")
    continue()
  endif()
  math(EXPR checked "${checked} + 1")
  file(STRINGS "${INCLUDE_DIR}/bellows/${header}" lines REGEX "^[ \t]*#[ \t]*include[ \t]*[<\"]bellows/")
  foreach(line IN LISTS lines)
    string(REGEX REPLACE "^[ \t]*#[ \t]*include[ \t]*[<\"]bellows/([^\">]*)[\">].*" "\\1" target "${line}")
    if(NOT target MATCHES "^(${allowed})")
      message(STATUS "include_layers_hold: ${header} includes bellows/${target}; allowed: ${allowed}")
      math(EXPR broken "${broken} + 1")
    endif()
  endforeach()
endforeach()
if(checked EQUAL 0)
  message(FATAL_ERROR "include_layers_hold: no header checked under ${INCLUDE_DIR}/bellows")
endif()
if(broken GREATER 0)
  message(FATAL_ERROR "include_layers_hold: ${broken} include(s) break the layers (of ${checked} headers checked)")
endif()
message(STATUS "include_layers_hold: ${checked} headers keep to their layers")
