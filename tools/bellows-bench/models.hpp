// SPDX-License-Identifier: Apache-2.0
// The layer lists of well-known models, by name and shape, for bellows-bench --model and the
// Synchronizer's benchmark: what their frameworks' named_parameters() lists, in that order.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "bellows/core/shape.hpp"

namespace bellows::tool {

/// torchvision's ResNet-50 (1000 classes): its 161 parameter tensors in the order of
/// named_parameters(), 25,557,032 parameters.
[[nodiscard]] inline std::vector<layer_info> resnet50() {
  std::vector<layer_info> out;
  auto add = [&out](std::string name, shape s) {
    out.push_back({static_cast<std::uint32_t>(out.size()), std::move(name), s});
  };
  auto norm = [&add](const std::string& name, std::size_t c) {
    add(name + ".weight", shape{c});
    add(name + ".bias", shape{c});
  };
  add("conv1.weight", shape{64, 3, 7, 7});
  norm("bn1", 64);
  const std::size_t blocks[] = {3, 4, 6, 3};
  std::size_t in = 64;
  for (std::size_t stage = 0; stage < 4; ++stage) {
    const std::size_t planes = std::size_t{64} << stage;
    for (std::size_t b = 0; b < blocks[stage]; ++b) {
      const std::string at = "layer" + std::to_string(stage + 1) + "." + std::to_string(b) + ".";
      add(at + "conv1.weight", shape{planes, in, 1, 1});
      norm(at + "bn1", planes);
      add(at + "conv2.weight", shape{planes, planes, 3, 3});
      norm(at + "bn2", planes);
      add(at + "conv3.weight", shape{4 * planes, planes, 1, 1});
      norm(at + "bn3", 4 * planes);
      if (b == 0) {
        add(at + "downsample.0.weight", shape{4 * planes, in, 1, 1});
        norm(at + "downsample.1", 4 * planes);
      }
      in = 4 * planes;
    }
  }
  add("fc.weight", shape{1000, 2048});
  add("fc.bias", shape{1000});
  return out;
}

/// BERT-base (uncased, with its pooler): its 199 parameter tensors in the order of
/// named_parameters(), 109,482,240 parameters.
[[nodiscard]] inline std::vector<layer_info> bert_base() {
  std::vector<layer_info> out;
  auto add = [&out](std::string name, shape s) {
    out.push_back({static_cast<std::uint32_t>(out.size()), std::move(name), s});
  };
  auto dense = [&add](const std::string& name, std::size_t rows, std::size_t cols) {
    add(name + ".weight", shape{rows, cols});
    add(name + ".bias", shape{rows});
  };
  constexpr std::size_t hidden = 768, inner = 3072;
  add("embeddings.word_embeddings.weight", shape{30522, hidden});
  add("embeddings.position_embeddings.weight", shape{512, hidden});
  add("embeddings.token_type_embeddings.weight", shape{2, hidden});
  add("embeddings.LayerNorm.weight", shape{hidden});
  add("embeddings.LayerNorm.bias", shape{hidden});
  for (std::size_t l = 0; l < 12; ++l) {
    const std::string at = "encoder.layer." + std::to_string(l) + ".";
    for (const char* m : {"query", "key", "value"}) dense(at + "attention.self." + m, hidden, hidden);
    dense(at + "attention.output.dense", hidden, hidden);
    add(at + "attention.output.LayerNorm.weight", shape{hidden});
    add(at + "attention.output.LayerNorm.bias", shape{hidden});
    dense(at + "intermediate.dense", inner, hidden);
    dense(at + "output.dense", hidden, inner);
    add(at + "output.LayerNorm.weight", shape{hidden});
    add(at + "output.LayerNorm.bias", shape{hidden});
  }
  dense("pooler.dense", hidden, hidden);
  return out;
}

}  // namespace bellows::tool
