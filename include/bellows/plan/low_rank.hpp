// SPDX-License-Identifier: Apache-2.0
// The matrix PowerSGD compresses, as the low-rank kernels of every backend view it
// (cpu/skinny_gemm.hpp), and the checks of its factors' sizes.
#pragma once

#include <cstddef>
#include <span>

#include "bellows/core/error.hpp"

namespace bellows {

/// The matrix M = g + e of PowerSGD, row-major, with e empty when there is no error memory.
struct compensated_matrix {
  std::span<const float> g;
  std::span<const float> e;
  std::size_t rows = 0;
  std::size_t cols = 0;

  [[nodiscard]] bool has_memory() const noexcept { return !e.empty(); }
};

namespace detail {

/// Raises bellows::error, naming `what`, when a factor has another number of floats than needed.
inline void check_factor(const char* what, std::size_t have, std::size_t need) {
  BELLOWS_EXPECTS(have == need, what, ": factor of ", have, " floats where ", need, " are needed");
}

/// Raises bellows::error, naming `what`, when g and e do not hold the matrix's elements.
inline void check_matrix(const char* what, const compensated_matrix& M) {
  BELLOWS_EXPECTS(M.g.size() == M.rows * M.cols && (M.e.empty() || M.e.size() == M.g.size()), what, ": a ", M.rows,
                  " x ", M.cols, " matrix with g of ", M.g.size(), " and e of ", M.e.size(), " floats");
}

/// Checks a product with M before it runs, raising bellows::error naming `what`: g and e hold the
/// matrix, and the factors p (n x r, `p_size` floats) and q (m x r, `q_size` floats) have the same
/// r columns, r counted in q (or in p when `rank_of_p`). Returns r; 0 for an empty matrix.
inline std::size_t checked_rank(const char* what, const compensated_matrix& M, std::size_t p_size, std::size_t q_size,
                                bool rank_of_p) {
  check_matrix(what, M);
  if (M.rows == 0 || M.cols == 0) return 0;
  const std::size_t rank = rank_of_p ? p_size / M.rows : q_size / M.cols;
  check_factor(what, p_size, rank * M.rows);
  check_factor(what, q_size, rank * M.cols);
  return rank;
}

}  // namespace detail

}  // namespace bellows
