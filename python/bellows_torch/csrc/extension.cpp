// SPDX-License-Identifier: Apache-2.0
// bellows_torch._C: the C++ half of the PyTorch DDP communication hook. A hook_state holds one
// bellows::synchronizer for a model's parameters, each registered under its name with a random-
// stream key of its name (so it draws the same numbers in any bucket), and each DDP bucket is one
// step_bucket of it: one process-group call per round and operation for the whole bucket. The
// gradients are averaged in place (float32 buckets) or in float32 working copies (bf16, fp16)
// through the process group's own collective (c10d, so gloo on CPU), wrapped as a bellows
// Collective. The reference() function runs one synchronizer per parameter on bellows' local
// (threads) collective, for the tests to compare the hook with.
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
/// block sizes first, then blocks padded to the largest: two process-group calls; allgather_slots,
/// for blocks of one size (a bucket's payloads), one; alltoall, the sizes and then the blocks by
/// all_to_all_single with split sizes (alltoall_base): two. calls() counts them all.
class process_group_collective {
public:
  explicit process_group_collective(c10::intrusive_ptr<c10d::ProcessGroup> group) : group_(std::move(group)) {}

  [[nodiscard]] std::size_t rank() const { return static_cast<std::size_t>(group_->getRank()); }
  [[nodiscard]] std::size_t size() const { return static_cast<std::size_t>(group_->getSize()); }

  void allreduce_sum(std::span<float> v) {
    if (v.empty()) return;
    std::vector<at::Tensor> tensors{at::from_blob(v.data(), {static_cast<std::int64_t>(v.size())}, at::kFloat)};
    ++calls_;
    group_->allreduce(tensors)->wait();
  }

  void allgather(std::span<const std::byte> mine, bellows::gather_buffer& out) {
    const std::size_t w = size();
    std::vector<at::Tensor> in{at::full({1}, static_cast<std::int64_t>(mine.size()), at::kLong)};
    std::vector<std::vector<at::Tensor>> counts(1);
    for (std::size_t r = 0; r < w; ++r) counts[0].push_back(at::empty({1}, at::kLong));
    ++calls_;
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
    ++calls_;
    group_->allgather(blocks, block)->wait();
    for (std::size_t r = 0; r < w; ++r)
      if (sizes_[r] != 0) std::memcpy(out.block(r).data(), blocks[0][r].data_ptr(), sizes_[r]);
  }

  /// Blocks of one size (a bucket's payloads): one allgather, straight into `slots`, rank r's
  /// block at byte r * slot. `mine` shorter than a slot goes padded with zeros.
  void allgather_slots(std::span<const std::byte> mine, std::span<std::byte> slots, std::size_t slot) {
    const std::size_t w = size();
    BELLOWS_EXPECTS(mine.size() <= slot && slots.size() >= w * slot, "bellows_torch: allgather_slots of ", mine.size(),
                    " bytes into ", slots.size(), " bytes of ", w, " slots of ", slot);
    if (slot == 0) return;
    const auto bytes = static_cast<std::int64_t>(slot);
    at::Tensor in =
        at::from_blob(const_cast<std::byte*>(mine.data()), {static_cast<std::int64_t>(mine.size())}, at::kByte);
    if (mine.size() < slot) in = at::constant_pad_nd(in, {0, bytes - in.numel()}, 0);
    std::vector<at::Tensor> ins{in};
    std::vector<std::vector<at::Tensor>> outs(1);
    for (std::size_t r = 0; r < w; ++r) outs[0].push_back(at::from_blob(slots.data() + r * slot, {bytes}, at::kByte));
    ++calls_;
    group_->allgather(outs, ins)->wait();
  }

  /// W blocks of one size (a bucket's scattered payloads): block j of `blocks` to rank j, in one
  /// alltoall, straight into `slots`, what rank i sent at byte i * slot.
  void alltoall_slots(std::span<const std::byte> blocks, std::span<std::byte> slots, std::size_t slot) {
    const std::size_t w = size();
    BELLOWS_EXPECTS(blocks.size() == w * slot && slots.size() >= w * slot, "bellows_torch: alltoall_slots of ",
                    blocks.size(), " bytes into ", slots.size(), " bytes of ", w, " slots of ", slot);
    if (slot == 0) return;
    const auto bytes = static_cast<std::int64_t>(w * slot);
    at::Tensor in = at::from_blob(const_cast<std::byte*>(blocks.data()), {bytes}, at::kByte);
    at::Tensor out = at::from_blob(slots.data(), {bytes}, at::kByte);
    std::vector<std::int64_t> even;
    ++calls_;
    group_->alltoall_base(out, in, even, even)->wait();
  }

  /// Block j of `blocks` (sizes[j] bytes) to rank j; `out` gets, at block i, what rank i sent
  /// this rank (bellows::AlltoallCollective).
  void alltoall(std::span<const std::byte> blocks, std::span<const std::size_t> sizes, bellows::gather_buffer& out) {
    const std::size_t w = size();
    bellows::check_alltoall_blocks("bellows_torch: alltoall", blocks, sizes, w);
    at::Tensor sent = at::empty({static_cast<std::int64_t>(w)}, at::kLong);
    for (std::size_t r = 0; r < w; ++r) sent.data_ptr<std::int64_t>()[r] = static_cast<std::int64_t>(sizes[r]);
    at::Tensor got = at::empty({static_cast<std::int64_t>(w)}, at::kLong);
    std::vector<std::int64_t> even, sent_splits(sent.data_ptr<std::int64_t>(), sent.data_ptr<std::int64_t>() + w);
    ++calls_;
    group_->alltoall_base(got, sent, even, even)->wait();
    std::vector<std::int64_t> got_splits(got.data_ptr<std::int64_t>(), got.data_ptr<std::int64_t>() + w);
    sizes_.assign(got_splits.begin(), got_splits.end());
    out.resize(sizes_);
    std::int64_t total = 0;
    for (const std::int64_t b : got_splits) total += b;
    at::Tensor in = blocks.empty() ? at::empty({0}, at::kByte)
                                   : at::from_blob(const_cast<std::byte*>(blocks.data()),
                                                   {static_cast<std::int64_t>(blocks.size())}, at::kByte);
    at::Tensor all = at::empty({total}, at::kByte);
    ++calls_;
    group_->alltoall_base(all, in, got_splits, sent_splits)->wait();
    std::size_t offset = 0;
    for (std::size_t r = 0; r < w; ++r) {
      if (sizes_[r] != 0) std::memcpy(out.block(r).data(), all.data_ptr<std::uint8_t>() + offset, sizes_[r]);
      offset += sizes_[r];
    }
  }

  [[nodiscard]] std::uint64_t calls() const noexcept { return calls_; }

private:
  c10::intrusive_ptr<c10d::ProcessGroup> group_;
  std::vector<std::size_t> sizes_;
  std::uint64_t calls_ = 0;
};

static_assert(bellows::AlltoallCollective<process_group_collective>,
              "the process group adapter must model AlltoallCollective");

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
  std::string exchange = "gather";    ///< how the ranks average: gather, scatter (QSGD, EF-signSGD) or leader (top-k)
  std::string owner_memory = "default";  ///< under scatter: default (the compressor's), on or off
};

/// Key of a parameter's random streams (layer_info::stream), added to the configuration's seed:
/// an FNV-1a hash of the parameter's name times the golden ratio's 64-bit fraction, so that a
/// parameter draws the same numbers whatever bucket, position or synchronizer holds it.
std::uint64_t name_key(const std::string& name) {
  std::uint64_t h = 0xCBF29CE484222325ULL;
  for (const char ch : name) h = (h ^ static_cast<unsigned char>(ch)) * 0x100000001B3ULL;
  return 0x9E3779B97F4A7C15ULL * h;
}

/// The type-erased synchronizer of a group of parameters (a model's, a DDP bucket's, or one
/// parameter's in reference()), each layer registered with its name's stream key.
struct group_runner {
  virtual ~group_runner() = default;
  virtual void add(const std::string& name, const bellows::shape& shape) = 0;
  /// One bucket of the step (synchronizer::step_bucket): the gradients of layers `ids`, averaged
  /// in place; the statuses in the order of ids.
  virtual std::span<const bellows::step_status> run(std::span<const std::uint32_t> ids,
                                                    std::span<const std::span<float>> grads,
                                                    process_group_collective& coll) = 0;
  virtual std::span<const bellows::step_status> run(std::span<const std::uint32_t> ids,
                                                    std::span<const std::span<float>> grads,
                                                    bellows::collectives::local& coll) = 0;
  virtual void end_epoch(float lr, process_group_collective& coll) = 0;
  virtual void end_epoch(float lr, bellows::collectives::local& coll) = 0;
  [[nodiscard]] virtual const bellows::layer_telemetry& telemetry(std::size_t id) const = 0;
  /// Accordion's mean-gradient norm of a layer at its last check (NaN before the first check,
  /// for a layer it does not observe, and without Accordion; telemetry() shows NaN as None).
  [[nodiscard]] virtual float checked_norm(std::size_t id) const = 0;
  /// PowerSGD only: a layer's query Q (m x r column-major, as r rows of m); empty otherwise.
  [[nodiscard]] virtual std::vector<float> query(std::size_t id, std::size_t& columns) const = 0;
  /// The synchronizer's checkpoint bytes (compressor states, detector, counters, telemetry) of
  /// this rank of the group.
  [[nodiscard]] virtual std::vector<std::byte> checkpoint(bellows::rank_place at) const = 0;
  /// Restores checkpoint() bytes of a runner of the same configuration and layers, at the same
  /// place; raises bellows::wire_error and changes nothing otherwise.
  virtual void restore(std::span<const std::byte> bytes, bellows::rank_place at) = 0;
};

template <class C, class D>
class runner final : public group_runner {
public:
  runner(C low, C high, D detector, bellows::level_change change, bellows::cpu::executor& exec)
      : sync_(std::move(low), std::move(high), std::move(detector), exec) {
    sync_.set_level_change(change);
  }
  void add(const std::string& name, const bellows::shape& shape) override {
    (void)sync_.add_layer(name, shape, name_key(name));
  }
  std::span<const bellows::step_status> run(std::span<const std::uint32_t> ids, std::span<const std::span<float>> grads,
                                            process_group_collective& coll) override {
    return sync_.step_bucket(ids, grads, coll);
  }
  std::span<const bellows::step_status> run(std::span<const std::uint32_t> ids, std::span<const std::span<float>> grads,
                                            bellows::collectives::local& coll) override {
    return sync_.step_bucket(ids, grads, coll);
  }
  void end_epoch(float lr, process_group_collective& coll) override { sync_.end_epoch(lr, coll); }
  void end_epoch(float lr, bellows::collectives::local& coll) override { sync_.end_epoch(lr, coll); }
  [[nodiscard]] const bellows::layer_telemetry& telemetry(std::size_t id) const override {
    return sync_.telemetry()[id];
  }
  [[nodiscard]] float checked_norm(std::size_t id) const override {
    if constexpr (std::is_same_v<D, bellows::accordion>) {
      const auto& s = sync_.detector().state();
      if (s.checks > 0 && sync_.telemetry()[id].participates) return s.norm_prev[id];
    }
    return std::numeric_limits<float>::quiet_NaN();
  }
  [[nodiscard]] std::vector<float> query(std::size_t id, std::size_t& columns) const override {
    columns = 0;
    if constexpr (requires(const typename C::state& s) {
                    s.query;
                    s.rank;
                  }) {
      const auto& st = sync_.state(id);
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
std::unique_ptr<group_runner> with_detector(const hook_config& cfg, C low, C high, bellows::cpu::executor& exec) {
  if (cfg.level_change != "keep" && cfg.level_change != "reset")
    bellows::fail("bellows_torch: level_change must be 'keep' or 'reset', got '", cfg.level_change, "'");
  const auto change = cfg.level_change == "keep" ? bellows::level_change::keep : bellows::level_change::reset;
  if (cfg.accordion) {
    bellows::accordion_params p;
    p.eta = cfg.eta;
    p.interval = cfg.interval;
    return std::make_unique<runner<C, bellows::accordion>>(std::move(low), std::move(high), bellows::accordion(p, exec),
                                                           change, exec);
  }
  return std::make_unique<runner<C, bellows::static_policy>>(
      std::move(low), std::move(high), bellows::static_policy(bellows::regime::critical), change, exec);
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

/// Method M's option `name`, or nullptr.
template <class M>
constexpr const bellows::method_option* option_of(std::string_view name) {
  for (const bellows::method_option& o : M::options)
    if (o.name == name) return &o;
  return nullptr;
}
template <class M>
constexpr bool has_option(std::string_view name) {
  return option_of<M>(name) != nullptr;
}

/// Method M's compressor at one level, with the configuration's memory, seed and PowerSGD knobs.
/// A level M refuses raises bellows::error naming the argument it came from (`which`, "low" or
/// "high"), e.g. "bellows_torch: low=1.5: topk: ratio must be in (0, 1], got 1.5".
template <class M>
typename M::template compressor<bellows::cpu::executor> compressor_at(const hook_config& cfg, const char* which,
                                                                      double level, bellows::cpu::executor& exec) {
  bellows::method_settings s;
  s.set("seed", std::to_string(cfg.seed));
  BELLOWS_EXPECTS(cfg.feedback == "default" || cfg.feedback == "residual" || cfg.feedback == "none",
                  "bellows_torch: error_feedback must be 'default', 'residual' or 'none', got '", cfg.feedback, "'");
  if (cfg.feedback != "default" && has_option<M>("error-feedback")) s.set("error-feedback", cfg.feedback);
  if (has_option<M>("min-compression-rate")) s.set("min-compression-rate", level_text(cfg.min_compression_rate));
  if (has_option<M>("warm-start")) s.set("warm-start", cfg.warm_start ? "true" : "false");
  if (cfg.exchange != "gather") {
    const bellows::method_option* exchange = option_of<M>("exchange");
    BELLOWS_EXPECTS(exchange != nullptr, "bellows_torch: exchange='", cfg.exchange, "': ", M::name,
                    " averages by its own exchange only (exchange='gather')");
    const auto choices = bellows::split_choices(exchange->choices);
    BELLOWS_EXPECTS(std::ranges::find(choices, std::string_view(cfg.exchange)) != choices.end(),
                    "bellows_torch: exchange='", cfg.exchange, "': ", M::name, "'s exchanges are ", exchange->choices);
    s.set("exchange", cfg.exchange);
  }
  if (cfg.owner_memory != "default") {
    BELLOWS_EXPECTS(has_option<M>("owner-memory"), "bellows_torch: owner_memory='", cfg.owner_memory, "': ", M::name,
                    " has no scatter exchange");
    s.set("owner-memory", cfg.owner_memory);
  }
  if (!M::level.empty()) s.set(M::level, level_text(level));
  try {
    return M::make(M::configure(s), exec);
  } catch (const bellows::error& e) {
    bellows::fail("bellows_torch: ", which, "=", level_text(level), ": ", e.what());
  }
}

/// A synchronizer without layers for a configuration; the hook and reference() both use it.
std::unique_ptr<group_runner> make_group(const hook_config& cfg, bellows::cpu::executor& exec) {
  std::unique_ptr<group_runner> out;
  const bool known = bellows::visit_method(bellows::compressor_methods{}, cfg.family, [&](auto m) {
    using M = typename decltype(m)::type;
    auto low = compressor_at<M>(cfg, "low", cfg.low, exec);
    auto high =
        cfg.accordion ? compressor_at<M>(cfg, "high", cfg.high, exec) : compressor_at<M>(cfg, "low", cfg.low, exec);
    out = with_detector(cfg, std::move(low), std::move(high), exec);
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

/// The state behind bellows_torch.State: synchronizers of groups of parameters, each parameter
/// keyed by its name. A State with a model has one group, "", of all its parameters, made up
/// front, and each DDP bucket is one step_bucket of it (so a parameter's state follows it into
/// whatever bucket DDP puts it in). A State without a model has a group per DDP bucket,
/// "bucket<i>", of the bucket's gradients, made when the bucket is first seen; a bucket seen again
/// with other gradients (names or shapes) starts its group over, and counts as a rebuild.
class hook_state {
public:
  hook_state(hook_config cfg, const c10::intrusive_ptr<c10d::ProcessGroup>& group)
      : cfg_(std::move(cfg)), exec_(std::make_unique<bellows::cpu::executor>(cfg_.threads)), coll_(group) {
    (void)make_group(cfg_, *exec_);  // fail at construction on a bad configuration, not in the first backward pass
  }

  /// Makes group `key` of these parameters unless it holds exactly them already (then nothing
  /// changes); a group made over again counts as a rebuild.
  void prepare(const std::string& key, const std::vector<std::string>& names,
               const std::vector<std::vector<std::int64_t>>& sizes) {
    TORCH_CHECK(names.size() == sizes.size(), "bellows_torch: ", names.size(), " names for ", sizes.size(), " shapes");
    const auto it = groups_.find(key);
    if (it != groups_.end() && it->second.names == names && it->second.sizes == sizes) return;
    group g{make_group(cfg_, *exec_), names, sizes, {}, std::vector<at::Tensor>(names.size())};
    for (std::size_t id = 0; id < names.size(); ++id) {
      TORCH_CHECK(g.ids.emplace(names[id], static_cast<std::uint32_t>(id)).second, "bellows_torch: parameter '",
                  names[id], "' named twice");
      g.runner->add(names[id], shape_of(sizes[id]));
    }
    if (it != groups_.end()) ++rebuilds_;
    groups_.insert_or_assign(key, std::move(g));
  }

  /// Averages one bucket in place (one step_bucket of group `key`; without a model, the group
  /// of the bucket is made first if needed): `grads` are the views of its parameters `names`
  /// into the bucket (float32, bfloat16 or float16, all of the bucket's dtype). Returns one
  /// status per gradient (0 ok, 1 non-finite: that gradient was left as it was).
  std::vector<std::uint8_t> run(const std::string& key, const std::vector<std::string>& names,
                                const std::vector<at::Tensor>& grads) {
    TORCH_CHECK(names.size() == grads.size(), "bellows_torch: ", names.size(), " names for ", grads.size(),
                " gradients");
    if (const auto it = groups_.find(key); !key.empty() && (it == groups_.end() || !it->second.holds(names, grads))) {
      std::vector<std::vector<std::int64_t>> sizes;  // a bucket's first step, or a rebuilt bucket: not every step
      for (const at::Tensor& g : grads) sizes.push_back(g.sizes().vec());
      prepare(key, names, sizes);
    }
    const auto found = groups_.find(key);
    TORCH_CHECK(found != groups_.end(), "bellows_torch: no parameters registered for the model");
    group& grp = found->second;
    ids_.clear();
    views_.clear();
    for (std::size_t j = 0; j < grads.size(); ++j) {
      const auto it = grp.ids.find(names[j]);
      TORCH_CHECK(it != grp.ids.end(), "bellows_torch: '", names[j], "' is not one of the State's parameters");
      const at::Tensor& g = grads[j];
      TORCH_CHECK(g.device().is_cpu(), "bellows_torch: the gradient of '", names[j], "' is on ", g.device(),
                  "; this build averages CPU tensors only");
      TORCH_CHECK(g.is_contiguous(), "bellows_torch: the gradient of '", names[j], "' is not contiguous");
      TORCH_CHECK(g.sizes().equals(grp.sizes[it->second]), "bellows_torch: the gradient of '", names[j], "' has shape ",
                  g.sizes(), ", the parameter ", at::IntArrayRef(grp.sizes[it->second]));
      const at::ScalarType t = g.scalar_type();
      TORCH_CHECK(t == at::kFloat || t == at::kBFloat16 || t == at::kHalf, "bellows_torch: the gradient of '", names[j],
                  "' is ", t, "; float32, bfloat16 and float16 are averaged");
      ids_.push_back(it->second);
      const auto n = static_cast<std::size_t>(g.numel());
      if (t == at::kFloat) {
        views_.emplace_back(g.data_ptr<float>(), n);
        continue;
      }
      // bf16 / fp16: the compressor works on the parameter's float32 copy, made once and reused.
      at::Tensor& work = grp.work[it->second];
      if (!work.defined()) work = at::empty(g.sizes(), at::kFloat);
      work.copy_(g);
      views_.emplace_back(work.data_ptr<float>(), n);
    }
    std::vector<std::uint8_t> statuses(grads.size());
    {
      py::gil_scoped_release unlocked;
      const std::span<const bellows::step_status> s = grp.runner->run(ids_, views_, coll_);
      for (std::size_t j = 0; j < s.size(); ++j) statuses[j] = static_cast<std::uint8_t>(s[j]);
    }
    for (std::size_t j = 0; j < grads.size(); ++j)
      if (grads[j].scalar_type() != at::kFloat) grads[j].copy_(grp.work[ids_[j]]);
    return statuses;
  }

  /// Ends the epoch for every group, in key order (a collective call on every rank): `lr` is the
  /// learning rate of the epoch that starts next.
  void end_epoch(float lr) {
    py::gil_scoped_release unlocked;
    for (auto& [key, g] : groups_) g.runner->end_epoch(lr, coll_);
  }

  [[nodiscard]] py::dict telemetry() const {
    py::dict out;
    for (const auto& [key, g] : groups_)
      for (std::size_t id = 0; id < g.names.size(); ++id) {
        const bellows::layer_telemetry& t = g.runner->telemetry(id);
        py::dict d;
        d["compressed"] = t.participates;
        d["level"] = t.level == bellows::regime::critical ? "low" : "high";
        d["steps"] = t.steps;
        d["skipped"] = t.skipped;
        d["bytes"] = t.sent.bytes;
        d["floats"] = t.sent.elements;
        const float norm = g.runner->checked_norm(id);
        d["norm"] = std::isnan(norm) ? py::object(py::none()) : py::object(py::float_(norm));
        out[py::str(g.names[id])] = d;
      }
    return out;
  }

  /// A parameter's PowerSGD query as a (columns, m) tensor: row j is column j of Q. Empty for
  /// other compressors and uncompressed parameters.
  [[nodiscard]] at::Tensor query(const std::string& name) const {
    for (const auto& [key, g] : groups_)
      if (const auto it = g.ids.find(name); it != g.ids.end()) {
        std::size_t columns = 0;
        std::vector<float> q = g.runner->query(it->second, columns);
        const auto cols = static_cast<std::int64_t>(columns);
        const std::int64_t m = cols == 0 ? 0 : static_cast<std::int64_t>(q.size()) / cols;
        return torch::from_blob(q.data(), {cols, m}, at::kFloat).clone();
      }
    bellows::fail("bellows_torch: no parameter '", name, "' has been seen");
  }

  /// The model's group: (names, shapes, its synchronizer's checkpoint bytes as a uint8 tensor).
  [[nodiscard]] py::tuple state() const {
    const group& g = model();
    const std::vector<std::byte> bytes = g.runner->checkpoint(coll_);
    at::Tensor t = at::empty({static_cast<std::int64_t>(bytes.size())}, at::kByte);
    if (!bytes.empty()) std::memcpy(t.data_ptr(), bytes.data(), bytes.size());
    return py::make_tuple(g.names, g.sizes, t);
  }

  /// Restores state()'s bytes into the model's group: into a new synchronizer of the same
  /// parameters first, so that any error (bytes of another compressor, level, rank or
  /// parameters, or truncated) raises and leaves the State as it was.
  void load(const at::Tensor& bytes) {
    TORCH_CHECK(bytes.scalar_type() == at::kByte && bytes.dim() == 1 && bytes.is_contiguous(),
                "bellows_torch: the saved synchronizer is not a flat uint8 tensor");
    group& g = model();
    std::unique_ptr<group_runner> next = make_group(cfg_, *exec_);
    for (std::size_t id = 0; id < g.names.size(); ++id) next->add(g.names[id], shape_of(g.sizes[id]));
    try {
      next->restore({static_cast<const std::byte*>(bytes.data_ptr()), static_cast<std::size_t>(bytes.numel())}, coll_);
    } catch (const bellows::error& err) {
      bellows::fail("bellows_torch: the saved state does not fit this State: ", err.what());
    }
    g.runner = std::move(next);
  }

  [[nodiscard]] std::size_t rebuilds() const noexcept { return rebuilds_; }
  /// Process-group calls made so far (an allreduce one, an allgather two).
  [[nodiscard]] std::uint64_t calls() const noexcept { return coll_.calls(); }

private:
  struct group {
    std::unique_ptr<group_runner> runner;
    std::vector<std::string> names;                ///< by layer id
    std::vector<std::vector<std::int64_t>> sizes;  ///< by layer id
    std::map<std::string, std::uint32_t> ids;      ///< name -> layer id
    std::vector<at::Tensor> work;                  ///< float32 copies of bf16 / fp16 gradients, made on first use

    /// Whether the group is of exactly these parameters, in this order, of these gradients' shapes.
    [[nodiscard]] bool holds(const std::vector<std::string>& of, const std::vector<at::Tensor>& grads) const {
      if (of != names) return false;
      for (std::size_t id = 0; id < grads.size(); ++id)
        if (!grads[id].sizes().equals(sizes[id])) return false;
      return true;
    }
  };

  [[nodiscard]] group& model() {
    const auto it = groups_.find("");
    TORCH_CHECK(it != groups_.end(), "bellows_torch: the State has no model");
    return it->second;
  }
  [[nodiscard]] const group& model() const { return const_cast<hook_state*>(this)->model(); }

  hook_config cfg_;
  std::unique_ptr<bellows::cpu::executor> exec_;
  process_group_collective coll_;
  std::map<std::string, group> groups_;
  std::size_t rebuilds_ = 0;
  std::vector<std::uint32_t> ids_;  // of the bucket in run, reused
  std::vector<std::span<float>> views_;
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
    std::vector<std::unique_ptr<group_runner>> runs;
    for (std::size_t j = 0; j < names.size(); ++j) {
      runs.push_back(make_group(cfg, exec));
      runs.back()->add(names[j], layer_shapes[j]);
    }
    const std::uint32_t only = 0;
    for (std::size_t s = 0; s < outputs[r].size(); ++s) {
      float* at = outputs[r][s].data_ptr<float>();
      for (std::size_t j = 0; j < runs.size(); ++j) {
        const std::span<float> g(at, layer_shapes[j].size());
        (void)runs[j]->run(std::span<const std::uint32_t>(&only, 1), std::span<const std::span<float>>(&g, 1), coll);
        at += layer_shapes[j].size();
      }
      if (s < end_epoch_lr.size() && end_epoch_lr[s] > 0)
        for (const auto& run : runs) run->end_epoch(end_epoch_lr[s], coll);
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
      .def_readwrite("level_change", &hook_config::level_change)
      .def_readwrite("exchange", &hook_config::exchange)
      .def_readwrite("owner_memory", &hook_config::owner_memory);
  py::class_<hook_state>(m, "HookState")
      .def(py::init<hook_config, const c10::intrusive_ptr<c10d::ProcessGroup>&>())
      .def("prepare", &hook_state::prepare)
      .def("run", &hook_state::run)
      .def("end_epoch", &hook_state::end_epoch)
      .def("state", &hook_state::state)
      .def("load", &hook_state::load)
      .def("telemetry", &hook_state::telemetry)
      .def("query", &hook_state::query)
      .def("rebuilds", &hook_state::rebuilds)
      .def("calls", &hook_state::calls);
  m.def("reference", &reference);
  // The process-group adapter's alltoall on its own, for the tests: blocks[j] (uint8) to rank j,
  // returns what each rank sent this one, and the process-group calls it made.
  m.def("alltoall", [](const c10::intrusive_ptr<c10d::ProcessGroup>& group, const std::vector<at::Tensor>& blocks) {
    process_group_collective coll(group);
    std::vector<std::size_t> sizes;
    std::vector<std::byte> bytes;
    for (const at::Tensor& b : blocks) {
      const at::Tensor c = b.contiguous();
      BELLOWS_EXPECTS(c.scalar_type() == at::kByte, "bellows_torch.alltoall: blocks of uint8");
      const auto* p = reinterpret_cast<const std::byte*>(c.data_ptr<std::uint8_t>());
      sizes.push_back(static_cast<std::size_t>(c.numel()));
      bytes.insert(bytes.end(), p, p + c.numel());
    }
    bellows::gather_buffer out;
    {
      py::gil_scoped_release release;
      coll.alltoall(bytes, sizes, out);
    }
    std::vector<at::Tensor> got;
    for (std::size_t r = 0; r < out.blocks(); ++r) {
      at::Tensor t = at::empty({static_cast<std::int64_t>(out.block(r).size())}, at::kByte);
      if (t.numel() > 0) std::memcpy(t.data_ptr<std::uint8_t>(), out.block(r).data(), out.block(r).size());
      got.push_back(t);
    }
    return std::pair{got, coll.calls()};
  });
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
