// SPDX-License-Identifier: Apache-2.0
// The two binary classification tasks of the Mem-SGD example, both held as sparse rows (CSR) with
// labels +1 / -1 and every row scaled to unit L2 norm, as the data sets of the paper are:
//
//  - Fashion-MNIST reduced to two classes (default: 0 "T-shirt/top" against 6 "Shirt", the pair
//    a linear model separates worst), d = 784 pixels scaled to [0, 1] before normalising; zero
//    pixels are not stored.
//  - A synthetic set shaped like RCV1 (text: many features, few per document, a few features in
//    many documents). The recipe, every draw from Philox keyed by the seed:
//      feature j (0-based) has popularity weight 1 / (j + 1)^0.8 (a Zipf-like law);
//      row i holds m_i distinct features, m_i uniform in [nnz/2, 3 nnz/2] (mean nnz), drawn
//        from the popularity law by inverse CDF, repeats drawn again;
//      each stored value is 1 - log(u), u uniform in (0, 1] (a positive, tf-idf-like weight);
//      the row is scaled to unit norm;
//      a planted direction w*_j ~ N(0, 1) gives the label y_i = sign(w* . a_i + 0.5 s z_i),
//        z_i ~ N(0, 1) and s the standard deviation of w* . a over the rows, so that about one
//        label in seven disagrees with the planted direction and no linear model is perfect.
//    Defaults: d = 40,000, nnz = 40 (density 0.1%), n = 20,000.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include <bellows/core/error.hpp>
#include <bellows/core/philox.hpp>

#include "fmnist/idx.hpp"

namespace memsgd {

/// n rows of d features in compressed sparse rows, labels +1 or -1.
struct dataset {
  std::string name;
  std::size_t d = 0;
  std::vector<std::size_t> row_begin{0};  ///< n + 1 offsets into index and value
  std::vector<std::uint32_t> index;       ///< ascending within a row
  std::vector<float> value;
  std::vector<float> label;

  [[nodiscard]] std::size_t n() const noexcept { return label.size(); }
  [[nodiscard]] std::size_t nonzeros() const noexcept { return index.size(); }
  /// Stored entries over n d.
  [[nodiscard]] double density() const noexcept {
    return n() == 0 ? 0.0 : static_cast<double>(nonzeros()) / (static_cast<double>(n()) * static_cast<double>(d));
  }
  [[nodiscard]] std::span<const std::uint32_t> row_index(std::size_t i) const noexcept {
    return {index.data() + row_begin[i], row_begin[i + 1] - row_begin[i]};
  }
  [[nodiscard]] std::span<const float> row_value(std::size_t i) const noexcept {
    return {value.data() + row_begin[i], row_begin[i + 1] - row_begin[i]};
  }
};

namespace detail {

/// Appends a row given as (index, value) pairs with ascending indices, scaled to unit norm.
inline void append_unit_row(dataset& data, std::span<const std::pair<std::uint32_t, float>> entries, float label) {
  double sq = 0;
  for (const auto& [j, v] : entries) sq += static_cast<double>(v) * v;
  BELLOWS_EXPECTS(sq > 0, "memsgd: ", data.name, ": row ", data.n(), " has no non-zero feature");
  const double inv = 1.0 / std::sqrt(sq);
  for (const auto& [j, v] : entries) {
    data.index.push_back(j);
    data.value.push_back(static_cast<float>(v * inv));
  }
  data.row_begin.push_back(data.index.size());
  data.label.push_back(label);
}

/// Uniform double in (0, 1] and a standard normal, from words of a Philox stream.
struct draws {
  bellows::philox::stream stream;
  std::uint64_t next = 0;
  double uniform() { return bellows::philox::to_uniform_nonzero(stream.word(next++)); }
  double normal() {
    const auto pair = bellows::philox::to_normals(stream.word(next), stream.word(next + 1));
    next += 2;
    return pair.first;
  }
};

}  // namespace detail

/// The training images of two Fashion-MNIST classes, in file order, at most `limit` of them (0:
/// all): `positive` gets label +1, `negative` -1.
[[nodiscard]] inline dataset binary_fmnist(const fmnist::split& split, std::size_t limit = 0, unsigned positive = 0,
                                           unsigned negative = 6) {
  BELLOWS_EXPECTS(positive < fmnist::classes && negative < fmnist::classes && positive != negative,
                  "memsgd: binary_fmnist needs two different classes in 0..", fmnist::classes - 1, ", got ", positive,
                  " and ", negative);
  dataset data;
  data.name = "fmnist-" + std::to_string(positive) + "v" + std::to_string(negative);
  data.d = fmnist::image_size;
  std::vector<std::pair<std::uint32_t, float>> row;
  for (std::size_t i = 0; i < split.count && (limit == 0 || data.n() < limit); ++i) {
    const unsigned c = split.labels[i];
    if (c != positive && c != negative) continue;
    row.clear();
    const std::uint8_t* pixels = split.images.data() + i * fmnist::image_size;
    for (std::uint32_t j = 0; j < fmnist::image_size; ++j)
      if (pixels[j] != 0) row.emplace_back(j, static_cast<float>(pixels[j]) / 255.0f);
    detail::append_unit_row(data, row, c == positive ? 1.0f : -1.0f);
  }
  BELLOWS_EXPECTS(data.n() > 0, "memsgd: no training image of class ", positive, " or ", negative);
  return data;
}

/// The recipe of the synthetic sparse set (see the top of this file).
struct sparse_recipe {
  std::size_t n = 20000;
  std::size_t d = 40000;
  std::size_t nnz = 40;  ///< mean stored features per row
  std::uint64_t seed = 1;
};

[[nodiscard]] inline dataset synthetic_sparse(const sparse_recipe& r) {
  BELLOWS_EXPECTS(r.n >= 1 && r.d >= 2 && r.nnz >= 2 && 3 * r.nnz / 2 <= r.d / 2,
                  "memsgd: sparse_recipe needs n >= 1, nnz >= 2 and 3 nnz / 2 <= d / 2, got n = ", r.n, ", d = ", r.d,
                  ", nnz = ", r.nnz);
  dataset data;
  data.name = "sparse-d" + std::to_string(r.d);
  data.d = r.d;
  std::vector<double> cdf(r.d);
  double total = 0;
  for (std::size_t j = 0; j < r.d; ++j) cdf[j] = total += std::pow(static_cast<double>(j + 1), -0.8);
  detail::draws planted{{r.seed, 0, 0, 0}};
  std::vector<double> w(r.d);
  for (double& v : w) v = planted.normal();

  std::vector<double> margin(r.n);
  std::vector<std::pair<std::uint32_t, float>> row;
  std::vector<char> taken(r.d, 0);
  for (std::size_t i = 0; i < r.n; ++i) {
    detail::draws rng{{r.seed, static_cast<std::uint32_t>(i), 1, 0}};
    const std::size_t lo = r.nnz / 2, hi = 3 * r.nnz / 2;
    const std::size_t m =
        lo + std::min(hi - lo, static_cast<std::size_t>(rng.uniform() * static_cast<double>(hi - lo + 1)));
    row.clear();
    while (row.size() < m) {
      const double target = (1.0 - rng.uniform()) * total;  // in [0, total)
      const auto j = static_cast<std::uint32_t>(std::upper_bound(cdf.begin(), cdf.end(), target) - cdf.begin());
      if (taken[j]) continue;  // target < total = cdf[d - 1], so j < d
      taken[j] = 1;
      row.emplace_back(j, static_cast<float>(1.0 - std::log(rng.uniform())));
    }
    std::sort(row.begin(), row.end());
    double dot = 0, sq = 0;
    for (const auto& [j, v] : row) {
      taken[j] = 0;
      dot += w[j] * v;
      sq += static_cast<double>(v) * v;
    }
    margin[i] = dot / std::sqrt(sq);
    detail::append_unit_row(data, row, 0.0f);
  }
  double mean = 0, var = 0;
  for (double v : margin) mean += v;
  mean /= static_cast<double>(r.n);
  for (double v : margin) var += (v - mean) * (v - mean);
  const double spread = std::sqrt(var / static_cast<double>(r.n));
  detail::draws noise{{r.seed, 0, 2, 0}};
  for (std::size_t i = 0; i < r.n; ++i) data.label[i] = margin[i] + 0.5 * spread * noise.normal() >= 0 ? 1.0f : -1.0f;
  return data;
}

}  // namespace memsgd
