// SPDX-License-Identifier: Apache-2.0
// The exceptions bellows throws, and the one check macro that raises them.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>

namespace bellows {

/// Base of every exception bellows throws: bad configuration, bad input, a failed collective.
class error : public std::runtime_error {
public:
  using std::runtime_error::runtime_error;
};

/// A payload or file from outside failed validation; nothing was changed.
class wire_error : public error {
public:
  using error::error;
};

/// A CUDA runtime or library call failed (raised by the CUDA backend's check macro).
class cuda_error : public error {
public:
  using error::error;
};

/// A collective operation failed, e.g. because another worker of the group threw.
class collective_error : public error {
public:
  using error::error;
};

namespace detail {

template <class... Parts>
std::string concat(Parts&&... parts) {
  std::ostringstream out;
  (out << ... << std::forward<Parts>(parts));
  return out.str();
}

}  // namespace detail

/// Raises `Error` (bellows::error unless named) whose message is `parts` streamed together, as
/// the library's own checks raise theirs: for code around bellows (a collective, a trainer, a
/// tool) whose errors should be bellows errors, catchable as bellows::error, e.g.
///   bellows::fail<bellows::wire_error>("gradients.npy: ", n, " floats where the layer has ", m);
template <class Error = error, class... Parts>
[[noreturn]] void fail(Parts&&... parts) {
  static_assert(std::is_base_of_v<error, Error>, "bellows::fail raises bellows::error or a class derived from it");
  throw Error(detail::concat(std::forward<Parts>(parts)...));
}

}  // namespace bellows

/// BELLOWS_EXPECTS(condition, message parts...): throws bellows::error whose text is the
/// message parts streamed together. The condition is not part of the text, so the message must
/// say by itself what is wrong and with which value, e.g.
///   BELLOWS_EXPECTS(ratio > 0 && ratio <= 1, "topk: ratio must be in (0, 1], got ", ratio);
/// -> "topk: ratio must be in (0, 1], got 0"
#define BELLOWS_EXPECTS(condition, ...)             \
  do {                                              \
    if (!(condition)) ::bellows::fail(__VA_ARGS__); \
  } while (false)
