// SPDX-License-Identifier: Apache-2.0
// bellows_torch._C: the C++ half of the PyTorch DDP communication hook. A hook_state holds one
// bellows::synchronizer per parameter, keyed by the parameter's name, so that a parameter's state
// follows it into whatever DDP bucket holds it. Each call of the hook hands it the names of a
// bucket's parameters and their gradient views into the bucket; each synchronizer averages its
// gradient in place (float32 buckets) or in a float32 working copy of its own (bf16, fp16)
// through the process group's own collective (c10d, so gloo on CPU), wrapped as a bellows
// Collective. The reference() function runs the same synchronizers on bellows' local (threads)
// collective, for the tests to compare the hook with.
#include <torch/extension.h>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/utils/pybind.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include <bellows/collectives/local.hpp>
#include <bellows/compressors/list.hpp>
#include <bellows/core/error.hpp>
#include <bellows/cpu/executor.hpp>
#include <bellows/regime/accordion.hpp>
#include <bellows/regime/static_policy.hpp>
#include <bellows/sync/synchronizer.hpp>

namespace {

namespace py = pybind11;

/// A c10d process group as a bellows Collective. Every call waits for its work (the hook's
/// asynchrony is one worker thread above this, see State in __init__.py). allgather gathers the
/// block sizes first, then blocks padded to the largest.
class process_group_collective {
public:
  explicit process_group_collective(c10::intrusive_ptr<c10d::ProcessGroup> group) : group_(std::move(group)) {}

  [[nodiscard]] std::size_t rank() const { return static_cast<std::size_t>(group_->getRank()); }
  [[nodiscard]] std::size_t size() const { return static_cast<std::size_t>(group_->getSize()); }

  void allreduce_sum(std::span<float> v) {
    if (v.empty()) return;
    std::vector<at::Tensor> tensors{at::from_blob(v.data(), {static_cast<std::int64_t>(v.size())}, at::kFloat)};
    group_->allreduce(tensors)->wait();
  }

  void allgather(std::span<const std::byte> mine, bellows::gather_buffer& out) {
    const std::size_t w = size();
    std::vector<at::Tensor> in{at::full({1}, static_cast<std::int64_t>(mine.size()), at::kLong)};
    std::vector<std::vector<at::Tensor>> counts(1);
    for (std::size_t r = 0; r < w; ++r) counts[0].push_back(at::empty({1}, at::kLong));
    group_->allgather(counts, in)->wait();
    sizes_.resize(w);
    std::size_t most = 0;
    for (std::size_t r = 0; r < w; ++r) {
      sizes_[r] = static_cast<std::size_t>(counts[0][r].item<std::int64_t>());
      most = std::max(most, sizes_[r]);
    }
    out.resize(sizes_);
    if (most == 0) return;
    std::vector<at::Tensor> block{at::zeros({static_cast<std::int64_t>(most)}, at::kByte)};
    if (!mine.empty()) std::memcpy(block[0].data_ptr(), mine.data(), mine.size());
    std::vector<std::vector<at::Tensor>> blocks(1);
    for (std::size_t r = 0; r < w; ++r) blocks[0].push_back(at::empty({static_cast<std::int64_t>(most)}, at::kByte));
    group_->allgather(blocks, block)->wait();
    for (std::size_t r = 0; r < w; ++r)
      if (sizes_[r] != 0) std::memcpy(out.block(r).data(), blocks[0][r].data_ptr(), sizes_[r]);
  }

private:
  c10::intrusive_ptr<c10d::ProcessGroup> group_;
  std::vector<std::size_t> sizes_;
};

static_assert(bellows::Collective<process_group_collective>, "the process group adapter must model Collective");

/// What the Python State passes down: the compressor family, its two levels, the policy.
struct hook_config {
  std::string family = "powersgd";  ///< a compressor of compressors/list.hpp
  double low = 4;                   ///< level in critical regimes (the option its descriptor's `level` names)
  double high = 1;                  ///< level elsewhere (used only with accordion)
  bool accordion = false;           ///< false: `low` always
  float eta = 0.5f;
  std::size_t interval = 10;
  std::string feedback = "default";  ///< default (the family's), residual or none
  std::uint64_t seed = 0;
  unsigned threads = 1;  ///< threads of the executor the compressors use
  float min_compression_rate = 2.0f;
  bool warm_start = true;
  std::string level_change = "keep";  ///< keep or reset: a layer's state when Accordion switches its level
};

/// Key of a parameter's random streams: the seed mixed with an FNV-1a hash of the parameter's
/// name, so that the streams do not depend on the bucket or the position that holds it.
std::uint64_t layer_seed(std::uint64_t seed, const std::string& name) {
  std::uint64_t h = 0xCBF29CE484222325ULL;
  for (const char ch : name) h = (h ^ static_cast<unsigned char>(ch)) * 0x100000001B3ULL;
  return seed + 0x9E3779B97F4A7C15ULL * h;
}

/// The type-erased synchronizer of one parameter (a synchronizer with one layer).
struct layer_runner {
  virtual ~layer_runner() = default;
  virtual std::uint8_t step(std::span<float> grad, process_group_collective& coll) = 0;
  virtual std::uint8_t step(std::span<float> grad, bellows::collectives::local& coll) = 0;
  virtual void end_epoch(float lr, process_group_collective& coll) = 0;
  virtual void end_epoch(float lr, bellows::collectives::local& coll) = 0;
  [[nodiscard]] virtual bellows::layer_telemetry telemetry() const = 0;
  /// Accordion's mean-gradient norm of the layer at its last check (NaN before the first check,
  /// for a layer it does not observe, and without Accordion; telemetry() shows NaN as None).
  [[nodiscard]] virtual float checked_norm() const = 0;
  /// PowerSGD only: the query Q (m x r column-major, as r rows of m); empty otherwise.
  [[nodiscard]] virtual std::vector<float> query(std::size_t& columns) const = 0;
  /// The synchronizer's checkpoint bytes (compressor state, detector, counters, telemetry) of
  /// this rank of the group.
  [[nodiscard]] virtual std::vector<std::byte> checkpoint(bellows::rank_place at) const = 0;
  /// Restores checkpoint() bytes of a runner of the same configuration, name, shape and place;
  /// raises bellows::wire_error and changes nothing otherwise.
  virtual void restore(std::span<const std::byte> bytes, bellows::rank_place at) = 0;
};

template <class C, class D>
class runner final : public layer_runner {
public:
  runner(C low, C high, D detector, bellows::level_change change, bellows::cpu::executor& exec, const std::string& name,
         const bellows::shape& shape)
      : sync_(std::move(low), std::move(high), std::move(detector), exec) {
    sync_.add_layer(name, shape);
    sync_.set_level_change(change);
  }
  std::uint8_t step(std::span<float> grad, process_group_collective& coll) override {
    return static_cast<std::uint8_t>(sync_.step(std::span<const std::span<float>>(&grad, 1), coll)[0]);
  }
  std::uint8_t step(std::span<float> grad, bellows::collectives::local& coll) override {
    return static_cast<std::uint8_t>(sync_.step(std::span<const std::span<float>>(&grad, 1), coll)[0]);
  }
  void end_epoch(float lr, process_group_collective& coll) override { sync_.end_epoch(lr, coll); }
  void end_epoch(float lr, bellows::collectives::local& coll) override { sync_.end_epoch(lr, coll); }
  [[nodiscard]] bellows::layer_telemetry telemetry() const override { return sync_.telemetry()[0]; }
  [[nodiscard]] float checked_norm() const override {
    if constexpr (std::is_same_v<D, bellows::accordion>) {
      const auto& s = sync_.detector().state();
      if (s.checks > 0 && sync_.telemetry()[0].participates) return s.norm_prev[0];
    }
    return std::numeric_limits<float>::quiet_NaN();
  }
  [[nodiscard]] std::vector<float> query(std::size_t& columns) const override {
    columns = 0;
    if constexpr (requires(const typename C::state& s) {
                    s.query;
                    s.rank;
                  }) {
      const auto& st = sync_.state(0);
      columns = st.rank;
      const std::span<const float> q = st.query.span();
      return {q.begin(), q.begin() + static_cast<std::ptrdiff_t>(st.rank * st.cols)};
    }
    return {};
  }
  [[nodiscard]] std::vector<std::byte> checkpoint(bellows::rank_place at) const override {
    return sync_.checkpoint(at);
  }
  void restore(std::span<const std::byte> bytes, bellows::rank_place at) override { sync_.restore(bytes, at); }

private:
  bellows::synchronizer<C, D> sync_;
};

template <class C>
std::unique_ptr<layer_runner> with_detector(const hook_config& cfg, C low, C high, bellows::cpu::executor& exec,
                                            const std::string& name, const bellows::shape& shape) {
  if (cfg.level_change != "keep" && cfg.level_change != "reset")
    bellows::fail("bellows_torch: level_change must be 'keep' or 'reset', got '", cfg.level_change, "'");
  const auto change = cfg.level_change == "keep" ? bellows::level_change::keep : bellows::level_change::reset;
  if (cfg.accordion) {
    bellows::accordion_params p;
    p.eta = cfg.eta;
    p.interval = cfg.interval;
    return std::make_unique<runner<C, bellows::accordion>>(std::move(low), std::move(high), bellows::accordion(p, exec),
                                                           change, exec, name, shape);
  }
  return std::make_unique<runner<C, bellows::static_policy>>(
      std::move(low), std::move(high), bellows::static_policy(bellows::regime::critical), change, exec, name, shape);
}

/// A level as option text: a whole number without a fraction (a rank or bits), else the shortest
/// text that reads back as the same double.
std::string level_text(double level) {
  if (std::isfinite(level) && level == std::floor(level) && std::abs(level) < 9e15)
    return std::to_string(static_cast<std::int64_t>(level));
  char buf[32];
  const auto [end, ec] = std::to_chars(buf, buf + sizeof buf, level);
  return {buf, end};
}

template <class M>
constexpr bool has_option(std::string_view name) {
  for (const bellows::method_option& o : M::options)
    if (o.name == name) return true;
  return false;
}

/// Method M's compressor at one level, with the configuration's memory, seed and PowerSGD knobs.
/// A level M refuses raises bellows::error naming the argument it came from (`which`, "low" or
/// "high"), e.g. "bellows_torch: low=1.5: topk: ratio must be in (0, 1], got 1.5".
template <class M>
typename M::template compressor<bellows::cpu::executor> compressor_at(const hook_config& cfg, const char* which,
                                                                      double level, std::uint64_t seed,
                                                                      bellows::cpu::executor& exec) {
  bellows::method_settings s;
  s.set("seed", std::to_string(seed));
  BELLOWS_EXPECTS(cfg.feedback == "default" || cfg.feedback == "residual" || cfg.feedback == "none",
                  "bellows_torch: error_feedback must be 'default', 'residual' or 'none', got '", cfg.feedback, "'");
  if (cfg.feedback != "default" && has_option<M>("error-feedback")) s.set("error-feedback", cfg.feedback);
  if (has_option<M>("min-compression-rate")) s.set("min-compression-rate", level_text(cfg.min_compression_rate));
  if (has_option<M>("warm-start")) s.set("warm-start", cfg.warm_start ? "true" : "false");
  if (!M::level.empty()) s.set(M::level, level_text(level));
  try {
    return M::make(M::configure(s), exec);
  } catch (const bellows::error& e) {
    bellows::fail("bellows_torch: ", which, "=", level_text(level), ": ", e.what());
  }
}

/// The synchronizer of one parameter for a configuration; the hook and reference() both use it.
std::unique_ptr<layer_runner> make_runner(const hook_config& cfg, bellows::cpu::executor& exec, const std::string& name,
                                          const bellows::shape& shape) {
  const std::uint64_t seed = layer_seed(cfg.seed, name);
  std::unique_ptr<layer_runner> out;
  const bool known = bellows::visit_method(bellows::compressor_methods{}, cfg.family, [&](auto m) {
    using M = typename decltype(m)::type;
    auto low = compressor_at<M>(cfg, "low", cfg.low, seed, exec);
    auto high = cfg.accordion ? compressor_at<M>(cfg, "high", cfg.high, seed, exec)
                              : compressor_at<M>(cfg, "low", cfg.low, seed, exec);
    out = with_detector(cfg, std::move(low), std::move(high), exec, name, shape);
  });
  if (!known)
    bellows::fail("bellows_torch: unknown compressor '", cfg.family, "' (",
                  bellows::method_names(bellows::compressor_methods{}), ")");
  return out;
}

bellows::shape shape_of(at::IntArrayRef sizes) {
  bellows::shape s;
  for (const std::int64_t d : sizes) s.push_back(static_cast<std::size_t>(d));
  return s;
}

/// The state behind bellows_torch.State: one synchronizer per parameter name, made when the name
/// is first seen (or up front by add()). A name seen again with another shape (only the
/// bucket-position names of a State without a model can do that) starts over and counts as a
/// rebuild.
class hook_state {
public:
  hook_state(hook_config cfg, const c10::intrusive_ptr<c10d::ProcessGroup>& group)
      : cfg_(std::move(cfg)), exec_(std::make_unique<bellows::cpu::executor>(cfg_.threads)), coll_(group) {
    // Fail at construction on a bad configuration, not in the first backward pass.
    (void)make_runner(cfg_, *exec_, "check", shape_of({1}));
  }

  /// Makes the synchronizer of a parameter (if `name` is new or its shape changed) without a step.
  void add(const std::string& name, const std::vector<std::int64_t>& sizes) { (void)entry_of(name, sizes); }

  /// Averages one bucket in place: `grads` are the views of its parameters `names` into the
  /// bucket (float32, bfloat16 or float16, all of the bucket's dtype). Returns one status per
  /// gradient (0 ok, 1 non-finite: that gradient was left as it was).
  std::vector<std::uint8_t> run(const std::vector<std::string>& names, const std::vector<at::Tensor>& grads) {
    TORCH_CHECK(names.size() == grads.size(), "bellows_torch: ", names.size(), " names for ", grads.size(),
                " gradients");
    std::vector<std::uint8_t> statuses(grads.size());
    py::gil_scoped_release unlocked;
    for (std::size_t j = 0; j < grads.size(); ++j) {
      const at::Tensor& g = grads[j];
      TORCH_CHECK(g.device().is_cpu(), "bellows_torch: the gradient of '", names[j], "' is on ", g.device(),
                  "; this build averages CPU tensors only");
      TORCH_CHECK(g.is_contiguous(), "bellows_torch: the gradient of '", names[j], "' is not contiguous");
      const at::ScalarType t = g.scalar_type();
      TORCH_CHECK(t == at::kFloat || t == at::kBFloat16 || t == at::kHalf, "bellows_torch: the gradient of '", names[j],
                  "' is ", t, "; float32, bfloat16 and float16 are averaged");
      entry& e = entry_of(names[j], g.sizes());
      const auto n = static_cast<std::size_t>(g.numel());
      if (t == at::kFloat) {
        statuses[j] = e.runner->step(std::span<float>(g.data_ptr<float>(), n), coll_);
        continue;
      }
      // bf16 / fp16: the compressor works on the layer's float32 copy, made once and reused.
      if (!e.work.defined()) e.work = at::empty(g.sizes(), at::kFloat);
      e.work.copy_(g);
      statuses[j] = e.runner->step(std::span<float>(e.work.data_ptr<float>(), n), coll_);
      g.copy_(e.work);
    }
    return statuses;
  }

  /// Ends the epoch for every parameter, in name order (a collective call on every rank): `lr`
  /// is the learning rate of the epoch that starts next.
  void end_epoch(float lr) {
    py::gil_scoped_release unlocked;
    for (auto& [name, e] : layers_) e.runner->end_epoch(lr, coll_);
  }

  [[nodiscard]] py::dict telemetry() const {
    py::dict out;
    for (const auto& [name, e] : layers_) {
      const bellows::layer_telemetry t = e.runner->telemetry();
      py::dict d;
      d["compressed"] = t.participates;
      d["level"] = t.level == bellows::regime::critical ? "low" : "high";
      d["steps"] = t.steps;
      d["skipped"] = t.skipped;
      d["bytes"] = t.sent.bytes;
      d["floats"] = t.sent.elements;
      const float norm = e.runner->checked_norm();
      d["norm"] = std::isnan(norm) ? py::object(py::none()) : py::object(py::float_(norm));
      out[py::str(name)] = d;
    }
    return out;
  }

  /// A parameter's PowerSGD query as a (columns, m) tensor: row j is column j of Q. Empty for
  /// other compressors and uncompressed parameters.
  [[nodiscard]] at::Tensor query(const std::string& name) const {
    std::size_t columns = 0;
    std::vector<float> q = known(name).runner->query(columns);
    const auto cols = static_cast<std::int64_t>(columns);
    const std::int64_t m = cols == 0 ? 0 : static_cast<std::int64_t>(q.size()) / cols;
    return torch::from_blob(q.data(), {cols, m}, at::kFloat).clone();
  }

  /// {name: (shape, checkpoint bytes as a uint8 tensor)} of every parameter.
  [[nodiscard]] py::dict state() const {
    py::dict out;
    for (const auto& [name, e] : layers_) {
      const std::vector<std::byte> bytes = e.runner->checkpoint(coll_);
      at::Tensor t = at::empty({static_cast<std::int64_t>(bytes.size())}, at::kByte);
      if (!bytes.empty()) std::memcpy(t.data_ptr(), bytes.data(), bytes.size());
      out[py::str(name)] = py::make_tuple(e.sizes, t);
    }
    return out;
  }

  /// Restores state(): every parameter named, with its shape and bytes. All of it is restored
  /// into new synchronizers first; any error (an unknown shape, bytes of another compressor or
  /// level, a truncated record) raises and leaves every parameter's state as it was.
  void load(const std::map<std::string, std::pair<std::vector<std::int64_t>, at::Tensor>>& saved) {
    std::map<std::string, entry> next;
    for (const auto& [name, item] : saved) {
      const auto& [sizes, bytes] = item;
      TORCH_CHECK(bytes.scalar_type() == at::kByte && bytes.dim() == 1 && bytes.is_contiguous(),
                  "bellows_torch: the state of '", name, "' is not a flat uint8 tensor");
      entry e{sizes, make_runner(cfg_, *exec_, name, shape_of(sizes)), {}};
      try {
        e.runner->restore({static_cast<const std::byte*>(bytes.data_ptr()), static_cast<std::size_t>(bytes.numel())},
                          coll_);
      } catch (const bellows::error& err) {
        bellows::fail("bellows_torch: the saved state of '", name, "' does not fit this State: ", err.what());
      }
      next.emplace(name, std::move(e));
    }
    layers_ = std::move(next);
  }

  [[nodiscard]] std::size_t rebuilds() const noexcept { return rebuilds_; }

private:
  struct entry {
    std::vector<std::int64_t> sizes;
    std::unique_ptr<layer_runner> runner;
    at::Tensor work;  ///< float32 copy of a bf16 / fp16 gradient, made on first use
  };

  entry& entry_of(const std::string& name, at::IntArrayRef sizes) {
    entry& e = layers_[name];
    if (!e.runner || !sizes.equals(e.sizes)) {
      if (e.runner) ++rebuilds_;
      e = entry{sizes.vec(), make_runner(cfg_, *exec_, name, shape_of(sizes)), {}};
    }
    return e;
  }

  [[nodiscard]] const entry& known(const std::string& name) const {
    const auto it = layers_.find(name);
    TORCH_CHECK(it != layers_.end(), "bellows_torch: no parameter '", name, "' has been seen");
    return it->second;
  }

  hook_config cfg_;
  std::unique_ptr<bellows::cpu::executor> exec_;
  process_group_collective coll_;
  std::map<std::string, entry> layers_;
  std::size_t rebuilds_ = 0;
};

/// bellows called directly: one synchronizer per layer `names[j]` on bellows' local collective,
/// one thread per rank. inputs[r][s] is rank r's gradients at step s, the layers laid out one
/// after the other in `shapes` order; end_epoch_lr[s] > 0 ends an epoch after step s with that
/// learning rate. Returns the outputs in the same layout, as new float32 tensors.
std::vector<std::vector<at::Tensor>> reference(const hook_config& cfg, const std::vector<std::string>& names,
                                               const std::vector<std::vector<std::int64_t>>& shapes,
                                               const std::vector<std::vector<at::Tensor>>& inputs,
                                               const std::vector<float>& end_epoch_lr) {
  const std::size_t w = inputs.size();
  TORCH_CHECK(w >= 1, "bellows_torch.reference: no ranks");
  TORCH_CHECK(names.size() == shapes.size(), "bellows_torch.reference: ", names.size(), " names for ", shapes.size(),
              " shapes");
  std::vector<bellows::shape> layer_shapes;
  std::int64_t total = 0;
  for (const auto& s : shapes) {
    layer_shapes.push_back(shape_of(s));
    total += static_cast<std::int64_t>(layer_shapes.back().size());
  }
  std::vector<std::vector<at::Tensor>> outputs(w);
  for (std::size_t r = 0; r < w; ++r)
    for (const at::Tensor& t : inputs[r]) {
      TORCH_CHECK(t.numel() == total, "bellows_torch.reference: an input has ", t.numel(), " elements, the layers ",
                  total);
      outputs[r].push_back(t.to(at::kFloat).contiguous().clone());
    }
  py::gil_scoped_release unlocked;
  bellows::cpu::executor exec(cfg.threads);
  bellows::collectives::local_group group(w);
  group.run([&](bellows::collectives::local& coll) {
    const std::size_t r = coll.rank();
    std::vector<std::unique_ptr<layer_runner>> runs;
    for (std::size_t j = 0; j < names.size(); ++j) runs.push_back(make_runner(cfg, exec, names[j], layer_shapes[j]));
    for (std::size_t s = 0; s < outputs[r].size(); ++s) {
      float* at = outputs[r][s].data_ptr<float>();
      for (std::size_t j = 0; j < runs.size(); ++j) {
        (void)runs[j]->step(std::span<float>(at, layer_shapes[j].size()), coll);
        at += layer_shapes[j].size();
      }
      if (s < end_epoch_lr.size() && end_epoch_lr[s] > 0) {
        std::vector<std::size_t> order(names.size());  // name order, as hook_state::end_epoch
        for (std::size_t j = 0; j < order.size(); ++j) order[j] = j;
        std::sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) { return names[a] < names[b]; });
        for (const std::size_t j : order) runs[j]->end_epoch(end_epoch_lr[s], coll);
      }
    }
  });
  return outputs;
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "bellows gradient compressors as a DDP communication hook (C++ half)";
  py::class_<hook_config>(m, "Config")
      .def(py::init<>())
      .def_readwrite("family", &hook_config::family)
      .def_readwrite("low", &hook_config::low)
      .def_readwrite("high", &hook_config::high)
      .def_readwrite("accordion", &hook_config::accordion)
      .def_readwrite("eta", &hook_config::eta)
      .def_readwrite("interval", &hook_config::interval)
      .def_readwrite("feedback", &hook_config::feedback)
      .def_readwrite("seed", &hook_config::seed)
      .def_readwrite("threads", &hook_config::threads)
      .def_readwrite("min_compression_rate", &hook_config::min_compression_rate)
      .def_readwrite("warm_start", &hook_config::warm_start)
      .def_readwrite("level_change", &hook_config::level_change);
  py::class_<hook_state>(m, "HookState")
      .def(py::init<hook_config, const c10::intrusive_ptr<c10d::ProcessGroup>&>())
      .def("add", &hook_state::add)
      .def("run", &hook_state::run)
      .def("end_epoch", &hook_state::end_epoch)
      .def("state", &hook_state::state)
      .def("load", &hook_state::load)
      .def("telemetry", &hook_state::telemetry)
      .def("query", &hook_state::query)
      .def("rebuilds", &hook_state::rebuilds);
  m.def("reference", &reference);
  m.def("default_level", [](const std::string& family) {
    double level = 0;  // identity: no level
    const bool known = bellows::visit_method(bellows::compressor_methods{}, family, [&](auto m) {
      using M = typename decltype(m)::type;
      for (const bellows::method_option& o : M::options)
        if (o.name == M::level) std::from_chars(o.fallback.data(), o.fallback.data() + o.fallback.size(), level);
    });
    if (!known) bellows::fail("bellows_torch: unknown compressor '", family, "'");
    return level;
  });
  m.def("families", [] {
    std::vector<std::string> names;
    bellows::for_each_method(bellows::compressor_methods{},
                             [&](auto m) { names.emplace_back(decltype(m)::type::name); });
    return names;
  });
  py::register_exception<bellows::error>(m, "BellowsError", PyExc_RuntimeError);
}
