// SPDX-License-Identifier: Apache-2.0
// The shape of a layer's tensor, and the identity of a layer.
#pragma once

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <string>

#include "bellows/core/checked.hpp"
#include "bellows/core/error.hpp"
#include "bellows/core/philox.hpp"

namespace bellows {

/// Dimensions of a tensor, outermost first, at most `max_dims` of them. A shape with no
/// dimensions is a scalar (one element). Element counts are checked against overflow.
class shape {
public:
  static constexpr std::size_t max_dims = 8;

  constexpr shape() = default;

  shape(std::initializer_list<std::size_t> dims) {
    BELLOWS_EXPECTS(dims.size() <= max_dims, "shape: at most ", max_dims, " dimensions, got ", dims.size());
    for (std::size_t d : dims) push_back(d);
  }

  /// A 1-D shape of n elements.
  static shape vector(std::size_t n) { return shape{n}; }

  void push_back(std::size_t d) {
    BELLOWS_EXPECTS(rank_ < max_dims, "shape: at most ", max_dims, " dimensions");
    (void)detail::checked_mul(size(), d, "shape: the element count of ", to_string(), " x ", d);
    dims_[rank_++] = d;
  }

  [[nodiscard]] constexpr std::size_t rank() const noexcept { return rank_; }
  [[nodiscard]] constexpr std::size_t operator[](std::size_t i) const noexcept { return dims_[i]; }

  /// Number of elements (the product of the dimensions; 1 for a scalar).
  [[nodiscard]] constexpr std::size_t size() const noexcept {
    std::size_t n = 1;
    for (std::size_t i = 0; i < rank_; ++i) n *= dims_[i];
    return n;
  }

  /// The matrix view PowerSGD uses: rows = d0, cols = d1 * ... * dk (1 for a vector).
  [[nodiscard]] constexpr std::size_t rows() const noexcept { return rank_ == 0 ? 1 : dims_[0]; }
  [[nodiscard]] constexpr std::size_t cols() const noexcept {
    std::size_t m = 1;
    for (std::size_t i = 1; i < rank_; ++i) m *= dims_[i];
    return m;
  }

  friend constexpr bool operator==(const shape& a, const shape& b) noexcept {
    return a.rank_ == b.rank_ && std::equal(a.dims_.begin(), a.dims_.begin() + a.rank_, b.dims_.begin());
  }

  /// "4096x512x3x3"; "scalar" for no dimensions.
  [[nodiscard]] std::string to_string() const {
    if (rank_ == 0) return "scalar";
    std::string s;
    for (std::size_t i = 0; i < rank_; ++i) {
      if (i) s += 'x';
      s += std::to_string(dims_[i]);
    }
    return s;
  }

private:
  std::array<std::size_t, max_dims> dims_{};
  std::size_t rank_ = 0;
};

/// What a compressor, memory or detector knows of a layer: its id (its index among the
/// registered layers, the same on every rank), its name (for messages), its shape, and what keys
/// its random streams.
struct layer_info {
  std::uint32_t id = 0;
  std::string name;
  bellows::shape shape;
  /// A layer registered with a key of its own (keyed) draws from {seed + key, step, 0, rank},
  /// whatever its id; others from {seed, step, id, rank}. bellows_torch keys a parameter by its
  /// name, so that it draws the same numbers in a model of any parameter order, or alone.
  bool keyed = false;
  std::uint64_t key = 0;

  [[nodiscard]] std::size_t size() const noexcept { return shape.size(); }

  /// The Philox stream of this layer for a compressor seeded `seed`, at `step`, for `rank`
  /// (philox::stream::shared for numbers every rank draws alike).
  [[nodiscard]] philox::stream stream(std::uint64_t seed, std::uint64_t step, std::uint32_t rank) const noexcept {
    return {keyed ? seed + key : seed, static_cast<std::uint32_t>(step), keyed ? 0u : id, rank};
  }
};

}  // namespace bellows
