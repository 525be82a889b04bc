// SPDX-License-Identifier: Apache-2.0
// Modified Gram-Schmidt over the columns of a tall, skinny column-major matrix (PowerSGD's P and
// Q), as docs/spec.md#orthogonalisation fixes it: column j is divided by (||column j|| + eps), then its projection is
// removed from every later column. A column of norm 0 stays 0 (never NaN), whatever eps is.
//
// One addition to plain MGS: a column that lost more than half its norm to the projections (it
// was nearly in the span of the columns before it, as when the matrix has rank below r) has
// them removed a second time before it is normalised ("twice is enough", Kahan and Parlett).
// Without it the rounding left in such a column is not orthogonal to the others, and P Q^T
// would not reproduce a matrix of rank < r. Columns that keep half their norm, as random ones
// do, see no second pass, so their arithmetic is plain MGS.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <span>

#include "bellows/core/error.hpp"
#include "bellows/cpu/executor.hpp"

namespace bellows::cpu {

namespace detail {

/// sum_i a[i] * b[i] in double, over four interleaved partial sums added in a fixed order.
[[nodiscard]] inline double dot_double(const float* a, const float* b, std::size_t n) noexcept {
  double s[4] = {0.0, 0.0, 0.0, 0.0};
  const std::size_t body = n / 4 * 4;
  for (std::size_t i = 0; i < body; i += 4)
    for (std::size_t l = 0; l < 4; ++l) s[l] += static_cast<double>(a[i + l]) * b[i + l];
  for (std::size_t i = body; i < n; ++i) s[0] += static_cast<double>(a[i]) * b[i];
  return (s[0] + s[1]) + (s[2] + s[3]);
}

}  // namespace detail

/// Orthonormalises in place the `cols.size() / rows` columns of `cols` (column j holds elements
/// j*rows .. j*rows+rows-1). Norms and projections are accumulated in double and rounded once to
/// float; each element is divided by the rounded norm (plus eps), not multiplied by its inverse.
/// Serial: its work is O(rows * rank^2), small beside the products that surround it, and a
/// fixed order keeps the result independent of the executor's thread count.
inline void orthogonalize(executor& /*exec*/, std::span<float> cols, std::size_t rows, float eps) {
  if (rows == 0) return;
  BELLOWS_EXPECTS(cols.size() % rows == 0, "orthogonalize: ", cols.size(), " floats are not whole columns of ", rows);
  BELLOWS_EXPECTS(eps >= 0.0f, "orthogonalize: eps must be >= 0, got ", eps);
  const std::size_t rank = cols.size() / rows;
  constexpr std::size_t most_columns = 64;  // larger ranks skip the second pass (no workspace)
  double before[most_columns];
  for (std::size_t j = 0; j < std::min(rank, most_columns); ++j) {
    const float* c = cols.data() + j * rows;
    before[j] = detail::dot_double(c, c, rows);
  }
  const auto remove_projection = [&](const float* c, float* d) {
    const auto projection = static_cast<float>(detail::dot_double(c, d, rows));
    for (std::size_t i = 0; i < rows; ++i) d[i] -= projection * c[i];
  };
  for (std::size_t j = 0; j < rank; ++j) {
    float* c = cols.data() + j * rows;
    double norm2 = detail::dot_double(c, c, rows);
    if (j > 0 && j < most_columns && norm2 < 0.25 * before[j]) {
      for (std::size_t l = 0; l < j; ++l) remove_projection(cols.data() + l * rows, c);
      norm2 = detail::dot_double(c, c, rows);
    }
    const auto norm = static_cast<float>(std::sqrt(norm2));
    if (norm == 0.0f) continue;  // a zero column stays zero; its projections are zero too
    const float divisor = norm + eps;
    for (std::size_t i = 0; i < rows; ++i) c[i] /= divisor;
    for (std::size_t l = j + 1; l < rank; ++l) remove_projection(c, cols.data() + l * rows);
  }
}

}  // namespace bellows::cpu
