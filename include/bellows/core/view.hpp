// SPDX-License-Identifier: Apache-2.0
// A span of memory that knows its shape and whether it lives on the host or a device.
#pragma once

#include <cstddef>
#include <span>
#include <type_traits>

#include "bellows/core/error.hpp"
#include "bellows/core/shape.hpp"

namespace bellows {

enum class memory_space : unsigned char { host, device };

[[nodiscard]] constexpr const char* to_string(memory_space s) noexcept {
  return s == memory_space::host ? "host" : "device";
}

/// A non-owning view of a tensor: pointer, shape and memory space. The element count of the
/// shape is the length of the memory.
template <class T>
class tensor_view {
public:
  constexpr tensor_view() = default;
  tensor_view(T* data, bellows::shape shp, memory_space space = memory_space::host)
      : data_(data), shape_(shp), space_(space) {
    BELLOWS_EXPECTS(data != nullptr || shp.size() == 0, "tensor_view: null data for a shape of ", shp.size(),
                    " elements");
  }
  /// A 1-D host view of a span.
  explicit tensor_view(std::span<T> s) : tensor_view(s.data(), bellows::shape::vector(s.size()), memory_space::host) {}

  [[nodiscard]] T* data() const noexcept { return data_; }
  [[nodiscard]] const bellows::shape& shape() const noexcept { return shape_; }
  [[nodiscard]] memory_space space() const noexcept { return space_; }
  [[nodiscard]] std::size_t size() const noexcept { return shape_.size(); }
  [[nodiscard]] bool empty() const noexcept { return size() == 0; }
  /// The elements as a span; for a device view the span must not be dereferenced on the host.
  [[nodiscard]] std::span<T> span() const noexcept { return {data_, size()}; }

  /// A read-only view of the same memory.
  // (clang-format-14 would join the requires clause to the declaration)
  // clang-format off
  operator tensor_view<const T>() const noexcept  // NOLINT(google-explicit-constructor)
    requires(!std::is_const_v<T>)
  {
    // clang-format on
    return tensor_view<const T>(data_, shape_, space_);
  }

private:
  T* data_ = nullptr;
  bellows::shape shape_{};
  memory_space space_ = memory_space::host;
};

}  // namespace bellows
