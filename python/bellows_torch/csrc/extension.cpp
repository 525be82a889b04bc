// SPDX-License-Identifier: Apache-2.0
// bellows_torch._C: the C++ half of the PyTorch DDP communication hook. A hook_state holds one
// bellows::synchronizer per DDP bucket; each call of the hook hands it the bucket's flat buffer
// and the per-parameter gradient views into it, and the synchronizer averages them in place
// through the process group's own collective (c10d, so gloo on CPU), wrapped as a bellows
// Collective. The reference() function runs the same synchronizers on bellows' local (threads)
// collective, for the tests to compare the hook with.
#include <torch/extension.h>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/utils/pybind.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include <bellows/collectives/local.hpp>
#include <bellows/compressors/identity.hpp>
#include <bellows/compressors/powersgd.hpp>
#include <bellows/compressors/qsgd.hpp>
#include <bellows/compressors/randk.hpp>
#include <bellows/compressors/topk.hpp>
#include <bellows/core/error.hpp>
#include <bellows/cpu/executor.hpp>
#include <bellows/regime/accordion.hpp>
#include <bellows/regime/static_policy.hpp>
#include <bellows/sync/synchronizer.hpp>

namespace {

namespace py = pybind11;

/// A c10d process group as a bellows Collective. Every call waits for its work: the hook is
/// synchronous. allgather gathers the block sizes first, then blocks padded to the largest.
class process_group_collective {
public:
  explicit process_group_collective(c10::intrusive_ptr<c10d::ProcessGroup> group)
      : group_(std::move(group)) {}

  [[nodiscard]] std::size_t rank() const { return static_cast<std::size_t>(group_->getRank()); }
  [[nodiscard]] std::size_t size() const { return static_cast<std::size_t>(group_->getSize()); }

  void allreduce_sum(std::span<float> v) {
    if (v.empty()) return;
    std::vector<at::Tensor> tensors{
        at::from_blob(v.data(), {static_cast<std::int64_t>(v.size())}, at::kFloat)};
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

static_assert(bellows::Collective<process_group_collective>,
              "the process group adapter must model Collective");

/// What the Python State passes down: the compressor family, its two levels, the policy.
struct hook_config {
  std::string family = "powersgd";  ///< identity, topk, randk, powersgd, qsgd
  double low = 4;                   ///< level in critical regimes (rank, ratio or bits)
  double high = 1;                  ///< level elsewhere (used only with accordion)
  bool accordion = false;           ///< false: `low` always
  float eta = 0.5f;
  std::size_t interval = 10;
  std::string feedback = "default"; ///< default (the family's), residual or none
  std::uint64_t seed = 0;
  unsigned threads = 1;             ///< threads of the executor the compressors use
  float min_compression_rate = 2.0f;
  bool warm_start = true;
};

/// Key of a bucket's random streams: layer ids restart at 0 in every bucket's synchronizer.
std::uint64_t bucket_seed(std::uint64_t seed, std::size_t bucket) {
  return seed + 0x9E3779B97F4A7C15ULL * static_cast<std::uint64_t>(bucket);
}

template <class Params>
void set_feedback(Params& p, const std::string& name) {
  if (name == "default") return;
  BELLOWS_EXPECTS(name == "residual" || name == "none",
                  "bellows_torch: error_feedback must be 'default', 'residual' or 'none', got '", name, "'");
  p.feedback = name == "residual" ? bellows::feedback::residual : bellows::feedback::none;
}

/// The type-erased synchronizer of one bucket.
struct bucket_runner {
  virtual ~bucket_runner() = default;
  virtual void step(std::span<const std::span<float>> grads, process_group_collective& coll) = 0;
  virtual void step(std::span<const std::span<float>> grads, bellows::collectives::local& coll) = 0;
  virtual void end_epoch(float lr, process_group_collective& coll) = 0;
  virtual void end_epoch(float lr, bellows::collectives::local& coll) = 0;
  [[nodiscard]] virtual std::vector<bellows::layer_telemetry> telemetry() const = 0;
  [[nodiscard]] virtual std::vector<std::uint8_t> last_statuses() const = 0;
  /// PowerSGD only: layer id's query Q (m x r column-major, as r rows of m); empty otherwise.
  [[nodiscard]] virtual std::vector<float> query(std::size_t id, std::size_t& columns) const = 0;
};

template <class C, class D>
class runner final : public bucket_runner {
public:
  runner(C low, C high, D detector, bellows::cpu::executor& exec, std::size_t bucket,
         std::span<const bellows::shape> shapes)
      : sync_(std::move(low), std::move(high), std::move(detector), exec) {
    for (std::size_t j = 0; j < shapes.size(); ++j)
      sync_.add_layer("bucket" + std::to_string(bucket) + ".grad" + std::to_string(j), shapes[j]);
  }
  void step(std::span<const std::span<float>> grads, process_group_collective& coll) override {
    remember(sync_.step(grads, coll));
  }
  void step(std::span<const std::span<float>> grads, bellows::collectives::local& coll) override {
    remember(sync_.step(grads, coll));
  }
  void end_epoch(float lr, process_group_collective& coll) override { sync_.end_epoch(lr, coll); }
  void end_epoch(float lr, bellows::collectives::local& coll) override { sync_.end_epoch(lr, coll); }
  [[nodiscard]] std::vector<bellows::layer_telemetry> telemetry() const override {
    return {sync_.telemetry().begin(), sync_.telemetry().end()};
  }
  [[nodiscard]] std::vector<std::uint8_t> last_statuses() const override { return statuses_; }
  [[nodiscard]] std::vector<float> query(std::size_t id, std::size_t& columns) const override {
    columns = 0;
    if constexpr (requires(const typename C::state& s) { s.query; s.rank; }) {
      const auto& st = sync_.state(id);
      columns = st.rank;
      return {st.query.begin(), st.query.begin() + static_cast<std::ptrdiff_t>(st.rank * st.cols)};
    }
    return {};
  }

private:
  void remember(std::span<const bellows::step_status> s) {
    statuses_.resize(s.size());
    for (std::size_t i = 0; i < s.size(); ++i) statuses_[i] = static_cast<std::uint8_t>(s[i]);
  }
  bellows::synchronizer<C, D> sync_;
  std::vector<std::uint8_t> statuses_;
};

template <class C>
std::unique_ptr<bucket_runner> with_detector(const hook_config& cfg, C low, C high,
                                             bellows::cpu::executor& exec, std::size_t bucket,
                                             std::span<const bellows::shape> shapes) {
  if (cfg.accordion) {
    bellows::accordion_params p;
    p.eta = cfg.eta;
    p.interval = cfg.interval;
    p.validate();
    return std::make_unique<runner<C, bellows::accordion>>(
        std::move(low), std::move(high), bellows::accordion(p, exec), exec, bucket, shapes);
  }
  return std::make_unique<runner<C, bellows::static_policy>>(
      std::move(low), std::move(high), bellows::static_policy(bellows::regime::critical), exec,
      bucket, shapes);
}

/// Top-k's or rand-k's parameters at one level (a ratio).
template <class Params>
Params sparse_params(const hook_config& cfg, double ratio, std::uint64_t seed) {
  Params p;
  p.ratio = ratio;
  p.seed = seed;
  set_feedback(p, cfg.feedback);
  return p;
}

/// The synchronizer of one bucket for a configuration; the hook and reference() both use it.
std::unique_ptr<bucket_runner> make_runner(const hook_config& cfg, bellows::cpu::executor& exec,
                                           std::size_t bucket, std::span<const bellows::shape> shapes) {
  const std::uint64_t seed = bucket_seed(cfg.seed, bucket);
  const double high = cfg.accordion ? cfg.high : cfg.low;
  if (cfg.family == "identity")
    return with_detector(cfg, bellows::identity<>(exec), bellows::identity<>(exec), exec, bucket, shapes);
  if (cfg.family == "topk")
    return with_detector(cfg, bellows::topk<>(sparse_params<bellows::topk_params>(cfg, cfg.low, seed), exec),
                         bellows::topk<>(sparse_params<bellows::topk_params>(cfg, high, seed), exec),
                         exec, bucket, shapes);
  if (cfg.family == "randk")
    return with_detector(cfg, bellows::randk<>(sparse_params<bellows::randk_params>(cfg, cfg.low, seed), exec),
                         bellows::randk<>(sparse_params<bellows::randk_params>(cfg, high, seed), exec),
                         exec, bucket, shapes);
  if (cfg.family == "powersgd") {
    auto make = [&](double rank) {
      BELLOWS_EXPECTS(rank >= 1 && rank == static_cast<double>(static_cast<std::size_t>(rank)),
                      "bellows_torch: a PowerSGD level is a whole rank >= 1, got ", rank);
      bellows::powersgd_params p;
      p.rank = static_cast<std::size_t>(rank);
      p.seed = seed;
      p.min_compression_rate = cfg.min_compression_rate;
      p.warm_start = cfg.warm_start;
      set_feedback(p, cfg.feedback);
      return p;
    };
    return with_detector(cfg, bellows::powersgd<>(make(cfg.low), exec),
                         bellows::powersgd<>(make(high), exec), exec, bucket, shapes);
  }
  if (cfg.family == "qsgd") {
    auto make = [&](double bits) {
      bellows::qsgd_params p;
      p.bits = static_cast<unsigned>(bits);
      BELLOWS_EXPECTS(static_cast<double>(p.bits) == bits, "bellows_torch: QSGD bits must be 2, 4 or 8, got ", bits);
      p.seed = seed;
      set_feedback(p, cfg.feedback);
      return p;
    };
    return with_detector(cfg, bellows::qsgd<>(make(cfg.low), exec), bellows::qsgd<>(make(high), exec),
                         exec, bucket, shapes);
  }
  bellows::detail::fail("bellows_torch: unknown compressor '", cfg.family,
                        "' (identity, topk, randk, powersgd or qsgd)");
}

bellows::shape shape_of(at::IntArrayRef sizes) {
  bellows::shape s;
  for (const std::int64_t d : sizes) s.push_back(static_cast<std::size_t>(d));
  return s;
}

/// One bucket as the hook last saw it: where each gradient starts in the buffer, and its shape.
struct bucket_layout {
  std::vector<std::int64_t> offsets;
  std::vector<std::vector<std::int64_t>> sizes;
  friend bool operator==(const bucket_layout&, const bucket_layout&) = default;
};

/// The state behind bellows_torch.State: one synchronizer per bucket index, made when the bucket
/// is first seen and made again (state lost) if DDP rebuilds that bucket with other parameters,
/// as it does once after the first iteration.
class hook_state {
public:
  hook_state(hook_config cfg, const c10::intrusive_ptr<c10d::ProcessGroup>& group)
      : cfg_(std::move(cfg)), exec_(std::make_unique<bellows::cpu::executor>(cfg_.threads)), coll_(group) {
    // Fail at construction on a bad configuration, not in the first backward pass.
    (void)make_runner(cfg_, *exec_, 0, {});
  }

  /// Averages one bucket in place: `buffer` is the flat bucket, `grads` the per-parameter views
  /// into it. Returns one status per gradient (0 ok, 1 non-finite: the buffer was left as it was).
  std::vector<std::uint8_t> run(std::size_t index, const at::Tensor& buffer, const std::vector<at::Tensor>& grads) {
    std::vector<std::span<float>> spans;
    bucket_runner& r = prepare(index, buffer, grads, &spans);
    {
      py::gil_scoped_release unlocked;
      r.step(spans, coll_);
    }
    return r.last_statuses();
  }

  /// Makes the synchronizer of a bucket as run() would (if its layout is new) without a step.
  bucket_runner& prepare(std::size_t index, const at::Tensor& buffer, const std::vector<at::Tensor>& grads,
                         std::vector<std::span<float>>* spans = nullptr) {
    TORCH_CHECK(buffer.device().is_cpu(), "bellows_torch: the bucket is on ", buffer.device(),
                "; this build averages CPU tensors only");
    TORCH_CHECK(buffer.scalar_type() == at::kFloat && buffer.is_contiguous(),
                "bellows_torch: the bucket must be a contiguous float32 tensor, got ", buffer.scalar_type());
    bucket_layout layout;
    const float* base = buffer.data_ptr<float>();
    const std::int64_t total = buffer.numel();
    for (const at::Tensor& g : grads) {
      TORCH_CHECK(g.scalar_type() == at::kFloat && g.is_contiguous(),
                  "bellows_torch: a gradient of the bucket is not a contiguous float32 view");
      const std::int64_t at = g.numel() == 0 ? 0 : g.data_ptr<float>() - base;
      TORCH_CHECK(at >= 0 && at + g.numel() <= total,
                  "bellows_torch: a gradient of the bucket is not a view into its buffer");
      layout.offsets.push_back(at);
      layout.sizes.push_back(g.sizes().vec());
      if (spans) spans->emplace_back(g.data_ptr<float>(), static_cast<std::size_t>(g.numel()));
    }
    entry& e = buckets_[index];
    if (!e.runner || !(e.layout == layout)) {
      std::vector<bellows::shape> shapes;
      for (const at::Tensor& g : grads) shapes.push_back(shape_of(g.sizes()));
      if (e.runner) ++rebuilds_;
      e.runner = make_runner(cfg_, *exec_, index, shapes);
      e.layout = std::move(layout);
    }
    return *e.runner;
  }

  /// Ends the epoch for every bucket (a collective call on every rank): `lr` is the learning rate
  /// of the epoch that starts next.
  void end_epoch(float lr) {
    py::gil_scoped_release unlocked;
    for (auto& [index, e] : buckets_) e.runner->end_epoch(lr, coll_);
  }

  [[nodiscard]] py::dict telemetry() const {
    py::dict out;
    for (const auto& [index, e] : buckets_) {
      py::list layers;
      for (const bellows::layer_telemetry& t : e.runner->telemetry()) {
        py::dict d;
        d["name"] = t.name;
        d["compressed"] = t.participates;
        d["level"] = t.level == bellows::regime::critical ? "low" : "high";
        d["steps"] = t.steps;
        d["skipped"] = t.skipped;
        d["bytes"] = t.sent.bytes;
        d["floats"] = t.sent.elements;
        layers.append(d);
      }
      out[py::int_(index)] = layers;
    }
    return out;
  }

  /// Layer `layer` of bucket `index`'s PowerSGD query as a (columns, m) tensor: row j is column j
  /// of Q. Empty for other compressors and uncompressed layers.
  [[nodiscard]] at::Tensor query(std::size_t index, std::size_t layer) const {
    const auto it = buckets_.find(index);
    TORCH_CHECK(it != buckets_.end(), "bellows_torch: bucket ", index, " has not been seen");
    std::size_t columns = 0;
    std::vector<float> q = it->second.runner->query(layer, columns);
    const auto cols = static_cast<std::int64_t>(columns);
    const std::int64_t m = cols == 0 ? 0 : static_cast<std::int64_t>(q.size()) / cols;
    return torch::from_blob(q.data(), {cols, m}, at::kFloat).clone();
  }

  [[nodiscard]] std::size_t rebuilds() const noexcept { return rebuilds_; }

private:
  struct entry {
    bucket_layout layout;
    std::unique_ptr<bucket_runner> runner;
  };
  hook_config cfg_;
  std::unique_ptr<bellows::cpu::executor> exec_;
  process_group_collective coll_;
  std::map<std::size_t, entry> buckets_;
  std::size_t rebuilds_ = 0;
};

/// bellows called directly: the synchronizer of bucket `index` on bellows' local collective, one
/// thread per rank. inputs[r][s] is rank r's flat bucket at step s (per-layer gradients laid out
/// one after the other, in `shapes` order); end_epoch_lr[s] > 0 ends an epoch after step s with
/// that learning rate. Returns the outputs in the same layout, as new tensors.
std::vector<std::vector<at::Tensor>> reference(const hook_config& cfg, std::size_t index,
                                               const std::vector<std::vector<std::int64_t>>& shapes,
                                               const std::vector<std::vector<at::Tensor>>& inputs,
                                               const std::vector<float>& end_epoch_lr) {
  const std::size_t w = inputs.size();
  TORCH_CHECK(w >= 1, "bellows_torch.reference: no ranks");
  std::vector<bellows::shape> layer_shapes;
  std::int64_t total = 0;
  for (const auto& s : shapes) {
    layer_shapes.push_back(shape_of(s));
    total += static_cast<std::int64_t>(layer_shapes.back().size());
  }
  std::vector<std::vector<at::Tensor>> outputs(w);
  for (std::size_t r = 0; r < w; ++r)
    for (const at::Tensor& t : inputs[r]) {
      TORCH_CHECK(t.numel() == total, "bellows_torch.reference: an input has ", t.numel(),
                  " elements, the layers ", total);
      outputs[r].push_back(t.to(at::kFloat).contiguous().clone());
    }
  py::gil_scoped_release unlocked;
  bellows::cpu::executor exec(cfg.threads);
  bellows::collectives::local_group group(w);
  group.run([&](bellows::collectives::local& coll) {
    const std::size_t r = coll.rank();
    std::unique_ptr<bucket_runner> run = make_runner(cfg, exec, index, layer_shapes);
    for (std::size_t s = 0; s < outputs[r].size(); ++s) {
      std::vector<std::span<float>> spans;
      float* at = outputs[r][s].data_ptr<float>();
      for (const bellows::shape& shp : layer_shapes) {
        spans.emplace_back(at, shp.size());
        at += shp.size();
      }
      run->step(spans, coll);
      if (s < end_epoch_lr.size() && end_epoch_lr[s] > 0) run->end_epoch(end_epoch_lr[s], coll);
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
      .def_readwrite("warm_start", &hook_config::warm_start);
  py::class_<hook_state>(m, "HookState")
      .def(py::init<hook_config, const c10::intrusive_ptr<c10d::ProcessGroup>&>())
      .def("run", &hook_state::run)
      .def("prepare", [](hook_state& h, std::size_t index, const at::Tensor& buffer,
                         const std::vector<at::Tensor>& grads) { (void)h.prepare(index, buffer, grads); })
      .def("end_epoch", &hook_state::end_epoch)
      .def("telemetry", &hook_state::telemetry)
      .def("query", &hook_state::query)
      .def("rebuilds", &hook_state::rebuilds);
  m.def("reference", &reference);
  py::register_exception<bellows::error>(m, "BellowsError", PyExc_RuntimeError);
}
