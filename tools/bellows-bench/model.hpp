// SPDX-License-Identifier: Apache-2.0
// bellows-bench --model: what one training step of a whole model costs on the wire, modeled
// without running it: the collective calls, the bytes each rank hands over and gets back, and
// the time on an alpha-beta link (collectives::counting's models), for each method exchanged
// layer by layer (each layer's reduce, as the Synchronizer did before buckets) and in the
// Synchronizer's buckets (sync/bucket_exchange.hpp), beside DDP's fp32 allreduce in buckets of
// the same budget. A method's calls come from its rounds() on each layer's state, a bucket's from
// the same part layout the exchange uses (part_floats, plan_buckets).
#pragma once

#include <nlohmann/json.hpp>

#include <cstddef>
#include <cstdio>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <ostream>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "bellows-bench/input.hpp"
#include "bellows-bench/models.hpp"
#include "bellows/collectives/counting.hpp"
#include "bellows/core/shape.hpp"
#include "bellows/core/traffic.hpp"
#include "bellows/sync/bucket_exchange.hpp"

namespace bellows::tool {

/// A model's layers: a built-in name (resnet50, bert-base) or a JSON file holding
/// {"layers": [{"name": "fc.weight", "shape": [10, 784]}, ...]}. A file that cannot be read or
/// holds anything else raises input_error naming the file and what is wrong.
[[nodiscard]] inline std::vector<layer_info> load_model(const std::string& what) {
  if (what == "resnet50") return resnet50();
  if (what == "bert-base") return bert_base();
  std::ifstream in(what);
  if (!in)
    throw input_error("--model " + what + ": neither a built-in model (resnet50, bert-base) nor a readable file");
  std::vector<layer_info> out;
  try {
    const nlohmann::json j = nlohmann::json::parse(in);
    for (const nlohmann::json& l : j.at("layers")) {
      shape s;
      for (const nlohmann::json& d : l.at("shape")) {
        if (s.rank() == shape::max_dims)
          throw input_error("--model " + what + ": layer '" + l.at("name").get<std::string>() + "' has more than " +
                            std::to_string(shape::max_dims) + " dimensions");
        s.push_back(d.get<std::size_t>());
      }
      out.push_back({static_cast<std::uint32_t>(out.size()), l.at("name").get<std::string>(), s});
    }
  } catch (const nlohmann::json::exception& e) {
    throw input_error("--model " + what +
                      ": not a layer list ({\"layers\": [{\"name\": ..., \"shape\": [...]}]}): " + e.what());
  }
  if (out.empty()) throw input_error("--model " + what + ": no layers");
  return out;
}

/// One step's figures for one rank.
struct step_model {
  std::uint64_t calls = 0;
  double handed = 0;  ///< bytes this rank hands to the calls
  double got = 0;     ///< bytes it receives: 2 (W - 1) / W of an allreduce's buffer, the other ranks' blocks of an
                      ///< allgather or an alltoall
  collectives::call_time time;

  void allreduce(double bytes, std::size_t ranks, const collectives::alpha_beta& link) {
    add(bytes, static_cast<double>(collectives::allreduce_received(static_cast<std::uint64_t>(bytes), ranks)),
        collectives::model_allreduce(bytes, ranks, link));
  }
  void allgather(double bytes, std::size_t ranks, const collectives::alpha_beta& link) {
    const double others = bytes * static_cast<double>(ranks - 1);
    add(bytes, others, collectives::model_allgather(others, ranks, link));
  }
  /// An alltoall of `block` bytes to each rank: it hands and receives the other ranks' blocks
  /// (its own stays), as collectives::counting counts them.
  void alltoall(double block, std::size_t ranks, const collectives::alpha_beta& link) {
    const double others = block * static_cast<double>(ranks - 1);
    add(others, others, collectives::model_alltoall(others, others, ranks, link));
  }

private:
  void add(double h, double g, collectives::call_time t) {
    ++calls;
    handed += h;
    got += g;
    time.ring_s += t.ring_s;
    time.cheapest_s += t.cheapest_s;
  }
};

/// The calls of one layer's reduce, added to `m`.
inline void add_reduce(step_model& m, const exchange_rounds& layer, std::size_t ranks,
                       const collectives::alpha_beta& link) {
  for (const exchange_round& r : layer) {
    if (r.op == collective_op::allreduce_sum)
      m.allreduce(static_cast<double>(r.bytes), ranks, link);
    else if (r.op == collective_op::alltoall)
      m.alltoall(static_cast<double>(r.bytes), ranks, link);
    else
      m.allgather(static_cast<double>(r.bytes), ranks, link);
  }
}

/// The step of layers whose rounds are `rounds`, each layer's reduce on its own.
[[nodiscard]] inline step_model per_layer(std::span<const exchange_rounds> rounds, std::size_t ranks,
                                          const collectives::alpha_beta& link) {
  step_model m;
  for (const exchange_rounds& layer : rounds) add_reduce(m, layer, ranks, link);
  return m;
}

/// The same step in buckets `bounds` (plan_buckets): a bucket of one layer is its reduce; a
/// larger one makes per round one allreduce of its layers' summed parts, one alltoall of their
/// scattered parts and one allgather of their payloads, each part padded as bucket_exchange
/// places it.
[[nodiscard]] inline step_model per_bucket(std::span<const exchange_rounds> rounds,
                                           std::span<const std::uint32_t> bounds, std::size_t ranks,
                                           const collectives::alpha_beta& link) {
  step_model m;
  for (std::size_t b = 0; b + 1 < bounds.size(); ++b) {
    const std::span<const exchange_rounds> bucket = rounds.subspan(bounds[b], bounds[b + 1] - bounds[b]);
    if (bucket.size() == 1) {
      add_reduce(m, bucket[0], ranks, link);
      continue;
    }
    std::size_t summed[exchange_rounds::capacity] = {}, scattered[exchange_rounds::capacity] = {},
                block[exchange_rounds::capacity] = {};
    for (const exchange_rounds& layer : bucket)
      for (std::size_t r = 0; r < layer.size(); ++r)
        (layer[r].op == collective_op::allreduce_sum ? summed
         : layer[r].op == collective_op::alltoall    ? scattered
                                                     : block)[r] += part_floats(layer[r].bytes);
    for (std::size_t r = 0; r < exchange_rounds::capacity; ++r) {
      if (summed[r] != 0) m.allreduce(static_cast<double>(summed[r] * sizeof(float)), ranks, link);
      if (scattered[r] != 0) m.alltoall(static_cast<double>(scattered[r] * sizeof(float)), ranks, link);
      if (block[r] != 0) m.allgather(static_cast<double>(block[r] * sizeof(float)), ranks, link);
    }
  }
  return m;
}

/// DDP's own exchange: one fp32 allreduce per bucket of its gradients.
[[nodiscard]] inline step_model ddp(std::span<const layer_info> layers, std::span<const std::uint32_t> bounds,
                                    std::size_t ranks, const collectives::alpha_beta& link) {
  step_model m;
  for (std::size_t b = 0; b + 1 < bounds.size(); ++b) {
    double bytes = 0;
    for (std::size_t id = bounds[b]; id < bounds[b + 1]; ++id) bytes += static_cast<double>(layers[id].size()) * 4;
    m.allreduce(bytes, ranks, link);
  }
  return m;
}

/// "30,1.25": a latency in microseconds and a bandwidth in GB/s; raises std::invalid_argument.
[[nodiscard]] inline collectives::alpha_beta parse_link(std::string_view text) {
  const std::size_t comma = text.find(',');
  if (comma == std::string_view::npos)
    throw std::invalid_argument("--link " + std::string(text) + ": give LATENCY_US,BANDWIDTH_GBPS, e.g. 30,1.25");
  std::size_t used = 0;
  const std::string lat(text.substr(0, comma)), bw(text.substr(comma + 1));
  double latency = 0, bandwidth = 0;
  try {
    latency = std::stod(lat, &used);
    if (used != lat.size()) throw std::invalid_argument("latency");
    bandwidth = std::stod(bw, &used);
    if (used != bw.size()) throw std::invalid_argument("bandwidth");
  } catch (const std::exception&) {
    throw std::invalid_argument("--link " + std::string(text) + ": give two numbers, LATENCY_US,BANDWIDTH_GBPS");
  }
  if (!(latency >= 0) || !(bandwidth > 0))
    throw std::invalid_argument("--link " + std::string(text) + ": the latency must be >= 0 and the bandwidth > 0");
  return {latency * 1e-6, bandwidth * 1e9};
}

/// What --model reports.
struct model_report {
  struct method_rows {
    std::string name;
    nlohmann::ordered_json params;
    step_model per_layer, per_bucket;
  };
  std::string model;
  std::vector<layer_info> layers;
  std::size_t buckets = 0, bucket_bytes = 0;
  collectives::alpha_beta link;
  std::size_t workers = 1;
  step_model ddp;
  std::vector<method_rows> methods;

  [[nodiscard]] std::size_t parameters() const {
    std::size_t n = 0;
    for (const layer_info& l : layers) n += l.size();
    return n;
  }
};

[[nodiscard]] inline nlohmann::ordered_json to_json(const step_model& m) {
  return {{"calls", m.calls},
          {"bytes_handed", m.handed},
          {"bytes_got", m.got},
          {"modeled_s", m.time.cheapest_s},
          {"modeled_ring_s", m.time.ring_s}};
}

[[nodiscard]] inline nlohmann::ordered_json to_json(const model_report& r) {
  nlohmann::ordered_json out = {{"model", r.model},
                                {"tensors", r.layers.size()},
                                {"parameters", r.parameters()},
                                {"buckets", r.buckets},
                                {"bucket_bytes", r.bucket_bytes},
                                {"latency_s", r.link.latency_s},
                                {"bandwidth_bytes_per_s", r.link.bandwidth_bytes_per_s},
                                {"workers", r.workers},
                                {"ddp_fp32", to_json(r.ddp)},
                                {"methods", nlohmann::ordered_json::array()}};
  for (const auto& m : r.methods)
    out["methods"].push_back({{"name", m.name},
                              {"params", m.params},
                              {"per_layer", to_json(m.per_layer)},
                              {"per_bucket", to_json(m.per_bucket)}});
  return out;
}

inline void print_table(std::ostream& os, const model_report& r) {
  char line[160];
  std::snprintf(line, sizeof line, "model: %s, %zu tensors, %zu parameters; %zu buckets of at most %.4g MiB\n",
                r.model.c_str(), r.layers.size(), r.parameters(), r.buckets,
                static_cast<double>(r.bucket_bytes) / 1048576.0);
  os << line;
  std::snprintf(line, sizeof line, "link:  %.4g us, %.4g GB/s; %zu workers; per rank and step\n",
                r.link.latency_s * 1e6, r.link.bandwidth_bytes_per_s / 1e9, r.workers);
  os << line;
  std::snprintf(line, sizeof line, "%-12s %-11s %7s %12s %12s %12s %12s\n", "method", "exchange", "calls", "handed MB",
                "got MB", "modeled ms", "ring ms");
  os << line;
  auto row = [&](const std::string& name, const char* how, const step_model& m) {
    std::snprintf(line, sizeof line, "%-12s %-11s %7llu %12.3f %12.3f %12.3f %12.3f\n", name.c_str(), how,
                  static_cast<unsigned long long>(m.calls), m.handed / 1e6, m.got / 1e6, m.time.cheapest_s * 1e3,
                  m.time.ring_s * 1e3);
    os << line;
  };
  row("ddp fp32", "per bucket", r.ddp);
  for (const auto& m : r.methods) {
    // its settings under its rows, so that two of one method (gather and leader) tell apart
    std::string options;
    for (const auto& [key, value] : m.params.items())
      options +=
          (options.empty() ? "  " : ", ") + key + " " + (value.is_string() ? value.get<std::string>() : value.dump());
    row(m.name, "per layer", m.per_layer);
    row("", "per bucket", m.per_bucket);
    os << options << '\n';
  }
  os << "modeled: each call by the cheapest of the ring and logarithmic algorithms (ring: every call a ring)\n";
}

}  // namespace bellows::tool
