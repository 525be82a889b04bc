// SPDX-License-Identifier: Apache-2.0
// Data-parallel training of the example's MLP on Fashion-MNIST: W workers, each holding a replica
// of the model and training on its own shard of every epoch, with the gradients averaged over the
// workers at every step by the averaging object the caller supplies. The workers are either
// threads of one process (train: a bellows::collectives::local_group) or the ranks of any other
// collective, one call of train_rank per rank (the MPI example, fmnist_mpi): the same loop.
//
// Plugging in gradient compression. The loop calls, on every worker,
//     averaging.step(grads, comm)     once per step, grads[id] = the gradient of tensor id
//     averaging.end_epoch(lr, comm)   once per epoch, lr = the next epoch's learning rate
//     averaging.total_sent()          for the traffic of each epoch
// which is exactly the surface of bellows::synchronizer. `uncompressed_averaging` below is the
// baseline; to train compressed, the factory handed to train() returns a synchronizer with the
// model's layers registered instead (a one-line change in main.cpp). An averaging object that
// also has step_bucket (the synchronizer) gets the step in buckets instead, each handed over as
// soon as the backward pass has finished its tensors, the way DDP hands its buckets to a
// communication hook: planned by bellows::plan_buckets from the last tensor back, in
// train_options::bucket_bytes (the synchronizer's own default, so the same bits as step).
//
// Determinism. The model is initialised from the seed alone, every epoch's shuffle is keyed by
// (seed, epoch), and the local collective sums in rank order, so every replica holds the same
// weights at every step and a seed gives the same weights, bit for bit, run after run. The MPI
// adapter in mpi_sum_order::rank sums in the same order, and gives the same bits.
//
// Checkpoints. With train_options::checkpoint set, the training state is written after every
// epoch (atomically): the weights and the optimizer's momentum (the same on every worker), every
// worker's averaging state (error memories, PowerSGD queries, the detector's accumulators and
// decisions), the epochs done and their reports (with the levels each epoch ran at). Nothing
// else is drawn at random: each epoch's shuffle is a function of (seed, epoch). A run started
// with train_options::resume at that file continues from there and ends with the weights of the
// run that was never interrupted, bit for bit.
#pragma once

#include <algorithm>
#include <chrono>
#include <cmath>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <filesystem>
#include <numeric>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include <bellows/collectives/local.hpp>
#include <bellows/compressors/identity.hpp>
#include <bellows/concepts.hpp>
#include <bellows/core/checkpoint.hpp>
#include <bellows/core/error.hpp>
#include <bellows/core/gather_buffer.hpp>
#include <bellows/core/philox.hpp>
#include <bellows/core/shape.hpp>
#include <bellows/core/traffic.hpp>
#include <bellows/sync/bucket_exchange.hpp>

#include "idx.hpp"
#include "model.hpp"

namespace fmnist {

/// What the training loop asks of the object that averages the gradients on one worker, over
/// the collective Coll.
template <class A, class Coll = bellows::collectives::local>
concept gradient_averaging = requires(A& a, const A& ca, std::span<const std::span<float>> grads, Coll& comm,
                                      float lr) {
  { a.step(grads, comm) } -> std::convertible_to<std::span<const bellows::step_status>>;
  a.end_epoch(lr, comm);
  { ca.total_sent() } -> std::convertible_to<bellows::traffic>;
};

/// An averaging object whose state a training checkpoint can hold (bellows::synchronizer is one).
template <class A>
concept checkpointable_averaging = requires(A& a, const A& ca, std::span<const std::byte> bytes,
                                            bellows::rank_place at) {
  { ca.checkpoint(at) } -> std::convertible_to<std::vector<std::byte>>;
  a.restore(bytes, at);
};

/// The baseline: every tensor averaged uncompressed by bellows::identity.
class uncompressed_averaging {
public:
  explicit uncompressed_averaging(std::span<const bellows::layer_info> layers) {
    for (const bellows::layer_info& layer : layers) states_.push_back(identity_.make_state(layer));
    statuses_.resize(layers.size());
  }

  template <bellows::Collective C>
  std::span<const bellows::step_status> step(std::span<const std::span<float>> grads, C& comm) {
    BELLOWS_EXPECTS(grads.size() == states_.size(), "uncompressed_averaging: ", grads.size(), " gradients for ",
                    states_.size(), " layers");
    for (std::size_t id = 0; id < grads.size(); ++id) {
      const bellows::reduce_result r = identity_.reduce(states_[id], grads[id], comm);
      statuses_[id] = r.status;
      sent_ += r.sent;
    }
    return statuses_;
  }

  template <bellows::Collective C>
  void end_epoch(float /*lr*/, C& /*comm*/) noexcept {}

  [[nodiscard]] bellows::traffic total_sent() const noexcept { return sent_; }

private:
  bellows::identity<> identity_;
  std::vector<bellows::identity<>::state> states_;
  std::vector<bellows::step_status> statuses_;
  bellows::traffic sent_{};
};

static_assert(gradient_averaging<uncompressed_averaging>);

struct train_options {
  /// The budget of the buckets handed to an averaging object with step_bucket (0: each tensor
  /// alone). Any budget gives the same bits.
  std::size_t bucket_bytes = std::size_t{25} << 20;
  std::size_t epochs = 10;
  std::uint64_t seed = 1;
  std::size_t workers = 4;
  std::size_t batch = 64;  ///< per worker; the global batch is workers * batch
  step_schedule schedule{0.1f, 0.1f, {5, 8}};
  float momentum = 0.9f;
  float weight_decay = 5e-4f;
  std::size_t train_limit = 0;  ///< train on the first train_limit images (0: all)
  /// Images per epoch: each epoch trains on the first epoch_limit images of its own shuffle of
  /// the training images, a fresh subset every epoch (0: all of them).
  std::size_t epoch_limit = 0;
  std::size_t test_limit = 0;        ///< test on the first test_limit images (0: all)
  std::filesystem::path checkpoint;  ///< when set, the training state is saved here after every epoch
  std::filesystem::path resume;      ///< when set, training continues from the state saved in this file

  /// Raises bellows::error naming the bad value.
  void validate(const dataset& data) const {
    BELLOWS_EXPECTS(epochs >= 1, "fmnist: epochs must be >= 1, got ", epochs);
    BELLOWS_EXPECTS(workers >= 1, "fmnist: workers must be >= 1, got ", workers);
    BELLOWS_EXPECTS(batch >= 1, "fmnist: batch must be >= 1, got ", batch);
    BELLOWS_EXPECTS(epoch_images(data) / workers >= batch, "fmnist: ", epoch_images(data),
                    " training images per epoch are too few for ", workers, " workers of batch ", batch);
    BELLOWS_EXPECTS(test_images(data) >= 1, "fmnist: no test images");
    BELLOWS_EXPECTS(std::isfinite(schedule.base) && schedule.base > 0, "fmnist: learning rate must be > 0, got ",
                    schedule.base);
  }
  [[nodiscard]] std::size_t train_images(const dataset& data) const noexcept {
    return train_limit == 0 ? data.train.count : std::min(train_limit, data.train.count);
  }
  [[nodiscard]] std::size_t epoch_images(const dataset& data) const noexcept {
    return epoch_limit == 0 ? train_images(data) : std::min(epoch_limit, train_images(data));
  }
  [[nodiscard]] std::size_t test_images(const dataset& data) const noexcept {
    return test_limit == 0 ? data.test.count : std::min(test_limit, data.test.count);
  }
};

/// One epoch as rank 0 saw it (the losses and accuracy are over all workers).
struct epoch_report {
  std::size_t epoch = 0;
  float lr = 0;                   ///< learning rate of this epoch
  double train_loss = 0;          ///< mean cross-entropy over the epoch's training batches
  double test_loss = 0;           ///< mean cross-entropy over the test images
  double test_accuracy = 0;       ///< fraction of test images classified right, in [0, 1]
  double seconds = 0;             ///< wall time of the epoch: training and evaluation
  std::size_t steps = 0;          ///< optimizer steps per worker
  std::size_t skipped_steps = 0;  ///< steps whose averaging reported non_finite (not applied)
  bellows::traffic sent{};        ///< what rank 0's averaging has sent since training began
  /// Bit id set: tensor id ran at the high compression level during this epoch (averaging
  /// objects with levels, such as bellows::synchronizer; 0 otherwise).
  std::uint64_t high_levels = 0;
};

struct train_result {
  std::vector<epoch_report> epochs;
  std::vector<float> weights;  ///< the final parameters (every replica holds the same)
};

/// The default epoch hook: does nothing.
struct ignore_epoch {
  template <class A>
  void operator()(const epoch_report& /*report*/, const A& /*averaging*/) const noexcept {}
};

namespace detail {

/// pixel value -> standardised input, with the mean and deviation of the pixels of the first
/// `images` training images (those the run trains on).
[[nodiscard]] inline std::vector<float> pixel_table(const split& train, std::size_t images) {
  std::vector<std::uint64_t> histogram(256, 0);
  for (std::size_t i = 0; i < images * image_size; ++i) ++histogram[train.images[i]];
  double sum = 0, squares = 0;
  for (std::size_t p = 0; p < histogram.size(); ++p) {
    const auto count = static_cast<double>(histogram[p]), value = static_cast<double>(p);
    sum += count * value;
    squares += count * value * value;
  }
  const double n = static_cast<double>(images * image_size);
  const double mean = sum / n, variance = squares / n - mean * mean;
  const double deviation = variance > 0 ? std::sqrt(variance) : 1.0;  // constant images: centre only
  std::vector<float> table(256);
  for (std::size_t p = 0; p < table.size(); ++p)
    table[p] = static_cast<float>((static_cast<double>(p) - mean) / deviation);
  return table;
}

/// order = a permutation of 0 .. order.size() - 1 drawn from (seed, epoch): Fisher-Yates with
/// Philox words, so it is the same on every worker and every platform.
inline void shuffle(std::span<std::uint32_t> order, std::uint64_t seed, std::size_t epoch) {
  constexpr std::uint32_t shuffle_stream = 0xFFFF0000u;  // apart from the model's tensor ids
  const bellows::philox::stream random{seed, static_cast<std::uint32_t>(epoch), shuffle_stream};
  for (std::size_t i = 0; i < order.size(); ++i) order[i] = static_cast<std::uint32_t>(i);
  for (std::size_t i = order.size(); i-- > 1;) {
    const std::uint32_t j = bellows::philox::to_below(random.word(i), static_cast<std::uint32_t>(i + 1));
    std::swap(order[i], order[j]);
  }
}

/// Copies the images `items` of a split, standardised, into x (row-major) and their labels.
inline void gather(const split& s, std::span<const std::uint32_t> items, std::span<const float> table,
                   std::span<float> x, std::span<std::uint8_t> labels) {
  for (std::size_t b = 0; b < items.size(); ++b) {
    const std::uint8_t* image = s.images.data() + std::size_t{items[b]} * image_size;
    for (std::size_t i = 0; i < image_size; ++i) x[b * image_size + i] = table[image[i]];
    labels[b] = s.labels[items[b]];
  }
}

/// The file of a training checkpoint: "FMCK", version, the settings it belongs to, then the state.
inline constexpr std::uint32_t checkpoint_magic = 0x4B434D46u;
inline constexpr std::uint32_t checkpoint_version = 2;  // 2: images per epoch, levels per epoch

/// The settings a checkpoint must have been saved with to be resumed by `options` on `workers`.
inline void put_settings(bellows::checkpoint_writer& w, const train_options& options, std::size_t workers,
                         std::size_t train_count, std::size_t epoch_count) {
  w.put(checkpoint_magic);
  w.put(checkpoint_version);
  w.put<std::uint64_t>(options.seed);
  w.put<std::uint64_t>(workers);
  w.put<std::uint64_t>(options.batch);
  w.put<std::uint64_t>(train_count);
  w.put<std::uint64_t>(epoch_count);
}

static_assert(std::is_trivially_copyable_v<epoch_report>, "epoch reports are saved as bytes");

/// One worker's training state between epochs, and its checkpoint file. A collective call on
/// every rank for both save and restore: the averaging states travel to rank 0 by allgather,
/// and the file, read by rank 0 only, to the others by broadcast (no shared file system needed).
template <class Model, class Optimizer, class Averaging>
class training_checkpoint {
public:
  training_checkpoint(const train_options& options, std::size_t train_count, std::size_t epoch_count, Model& model,
                      Optimizer& optimizer, Averaging& averaging)
      : options_(&options), train_count_(train_count), epoch_count_(epoch_count), model_(&model),
        optimizer_(&optimizer), averaging_(&averaging) {}

  /// After epoch `done - 1`: rank 0 writes the file atomically.
  template <bellows::Collective Coll>
  void save(Coll& comm, std::span<const epoch_report> reports) {
    const std::vector<std::byte> mine = averaging_->checkpoint(comm);
    comm.allgather(mine, gathered_);
    if (comm.rank() != 0) return;
    bellows::checkpoint_writer w;
    put_settings(w, *options_, comm.size(), train_count_, epoch_count_);
    w.put<std::uint64_t>(reports.size());
    w.put_array(std::span<const epoch_report>(reports));
    w.put_array(std::span<const float>(model_->parameters()));
    w.put_array(std::span<const float>(optimizer_->velocity()));
    for (std::size_t r = 0; r < comm.size(); ++r) w.put_array(std::span<const std::byte>(gathered_.block(r)));
    bellows::write_file_atomically(options_->checkpoint, w.bytes());
  }

  /// Restores the state of options.resume; returns the reports of the epochs done.
  template <bellows::Collective Coll>
  std::vector<epoch_report> restore(Coll& comm) {
    const std::filesystem::path& path = options_->resume;
    std::vector<std::byte> file;
    std::uint64_t size = 0;
    std::exception_ptr failure;
    if (comm.rank() == 0) {
      try {
        file = bellows::read_file(path);
        size = file.size();
      } catch (...) {
        failure = std::current_exception();
        size = unreadable;
      }
    }
    comm.broadcast(std::as_writable_bytes(std::span<std::uint64_t>(&size, 1)), 0);
    if (failure) std::rethrow_exception(failure);
    if (size == unreadable) bellows::fail("fmnist: rank 0 could not read the checkpoint ", path);
    file.resize(size);
    comm.broadcast(file, 0);
    try {
      return read(file, comm.rank(), comm.size());
    } catch (const bellows::wire_error& e) {
      bellows::fail<bellows::wire_error>(path.string(), ": ", e.what());
    }
  }

private:
  static constexpr std::uint64_t unreadable = ~std::uint64_t{0};

  std::vector<epoch_report> read(std::span<const std::byte> file, std::size_t rank, std::size_t workers) {
    bellows::checkpoint_reader r(file);
    bellows::checkpoint_writer expected;
    put_settings(expected, *options_, workers, train_count_, epoch_count_);
    for (const std::byte b : expected.bytes())
      if (r.get<std::byte>("settings") != b)
        bellows::fail<bellows::wire_error>(
            "not a checkpoint of this training (another version, seed, number of workers, batch or "
            "number of training images or images per epoch)");
    const auto done = r.get<std::uint64_t>("epochs done");
    if (done > options_->epochs)
      bellows::fail<bellows::wire_error>(done, " epochs done, more than the ", options_->epochs, " to train");
    std::vector<epoch_report> reports(done);
    r.get_array(std::span<epoch_report>(reports), "epoch reports");
    // Into copies first: a file that fails to read to its end changes nothing.
    std::vector<float> weights(model_->parameters().size()), velocity(weights.size());
    r.get_array(std::span<float>(weights), "weights");
    r.get_array(std::span<float>(velocity), "momentum");
    std::string mine;
    for (std::size_t w = 0; w < workers; ++w) {
      std::string state = r.get_string("averaging state", file.size());
      if (w == rank) mine = std::move(state);
    }
    r.finish();
    averaging_->restore(std::as_bytes(std::span<const char>(mine)), {rank, workers});
    std::copy(weights.begin(), weights.end(), model_->parameters().begin());
    std::copy(velocity.begin(), velocity.end(), optimizer_->velocity().begin());
    return reports;
  }

  const train_options* options_;
  std::size_t train_count_, epoch_count_;
  Model* model_;
  Optimizer* optimizer_;
  Averaging* averaging_;
  bellows::gather_buffer gathered_;
};

}  // namespace detail

namespace detail {

/// Bit id set where tensor id is at the high level (an averaging object with a synchronizer's
/// telemetry), else 0.
template <class Averaging>
[[nodiscard]] std::uint64_t high_level_bits(const Averaging& averaging) {
  std::uint64_t bits = 0;
  if constexpr (requires { averaging.telemetry(); }) {
    const auto layers = averaging.telemetry();
    BELLOWS_EXPECTS(layers.size() <= 64,
                    "fmnist: epoch reports record the levels of at most 64 tensors, the "
                    "model has ",
                    layers.size());
    for (std::size_t id = 0; id < layers.size(); ++id)
      if (layers[id].level == bellows::regime::normal) bits |= std::uint64_t{1} << id;
  }
  return bits;
}

/// The training loop of one worker, rank comm.rank() of comm.size(), on the images of `table`'s
/// standardisation. Returns the weights on every rank and the epoch reports on rank 0.
template <bellows::Collective Coll, class MakeAveraging, class OnEpoch>
train_result train_worker(const dataset& data, const train_options& options, std::span<const float> table, Coll& comm,
                          MakeAveraging& make_averaging, OnEpoch& on_epoch) {
  const std::size_t train_count = options.train_images(data), test_count = options.test_images(data);
  const std::size_t epoch_count = options.epoch_images(data);
  const std::size_t batch = options.batch;
  const std::size_t rank = comm.rank(), workers = comm.size();
  mlp<float> model(options.seed, batch);
  sgd<float> optimizer(model.parameters().size(), options.momentum, options.weight_decay);
  auto averaging = make_averaging(model.layers());
  using averaging_type = decltype(averaging);
  static_assert(gradient_averaging<averaging_type, Coll>, "make_averaging must return a gradient_averaging object");
  train_result result;
  std::size_t first_epoch = 0;
  const bool checkpoints = !options.checkpoint.empty() || !options.resume.empty();
  BELLOWS_EXPECTS(!checkpoints || checkpointable_averaging<averaging_type>,
                  "fmnist: checkpoints need an averaging object with checkpoint() and restore()");
  [[maybe_unused]] auto saver = [&] {
    if constexpr (checkpointable_averaging<averaging_type>)
      return training_checkpoint(options, train_count, epoch_count, model, optimizer, averaging);
    else
      return 0;
  }();
  if constexpr (checkpointable_averaging<averaging_type>) {
    if (!options.resume.empty()) {
      std::vector<epoch_report> done = saver.restore(comm);
      first_epoch = done.size();
      if (rank == 0) {
        result.epochs = std::move(done);
        if constexpr (requires { on_epoch.resumed(std::as_const(averaging), result.epochs); })
          on_epoch.resumed(std::as_const(averaging), std::as_const(result.epochs));
      }
    }
  }
  std::vector<std::span<float>> grads;
  for (std::size_t id = 0; id < model.layers().size(); ++id) grads.push_back(model.gradient(id));
  // The buckets: bucket b is tensors [bounds[b], bounds[b + 1]), its ids and gradients slices of
  // `ids` and `grads`.
  const std::vector<std::uint32_t> bounds = bellows::plan_buckets(model.layers(), options.bucket_bytes);
  std::vector<std::uint32_t> ids(grads.size());
  std::iota(ids.begin(), ids.end(), 0u);
  const auto bucket = [&](std::size_t b) {
    const std::size_t first = bounds[b], count = bounds[b + 1] - first;
    return std::pair{std::span<const std::uint32_t>(ids).subspan(first, count),
                     std::span<const std::span<float>>(grads).subspan(first, count)};
  };
  std::vector<float> x(batch * image_size);
  std::vector<std::uint8_t> labels(batch);
  std::vector<std::uint32_t> order(train_count), test_items(batch);
  // Each epoch every worker takes its own contiguous part of the first epoch_count images of the
  // shuffled order.
  const std::size_t shard = epoch_count / workers, steps = shard / batch;
  const std::size_t test_lo = test_count * rank / workers, test_hi = test_count * (rank + 1) / workers;

  for (std::size_t epoch = first_epoch; epoch < options.epochs; ++epoch) {
    const auto start = std::chrono::steady_clock::now();
    const float lr = options.schedule.at(epoch);
    const std::uint64_t high_levels = high_level_bits(averaging);
    shuffle(order, options.seed, epoch);
    double train_loss = 0;
    std::size_t skipped = 0;
    for (std::size_t step = 0; step < steps; ++step) {
      const std::span<const std::uint32_t> items(order.data() + rank * shard + step * batch, batch);
      gather(data.train, items, table, x, labels);
      bool ok = true;
      const auto take = [&ok](std::span<const bellows::step_status> statuses) {
        for (const bellows::step_status s : statuses) ok = ok && s == bellows::step_status::ok;
      };
      if constexpr (requires { averaging.step_bucket(bucket(0).first, bucket(0).second, comm); }) {
        std::size_t next = bounds.size() - 1;  // the buckets not yet handed over are [0, next)
        train_loss += static_cast<double>(model.train_batch(x, labels, [&](std::size_t ready) {
          for (; next > 0 && bounds[next - 1] >= ready; --next) {
            const auto [bucket_ids, bucket_grads] = bucket(next - 1);
            take(averaging.step_bucket(bucket_ids, bucket_grads, comm));
          }
        }));
      } else {
        train_loss += static_cast<double>(model.train_batch(x, labels));
        take(averaging.step(grads, comm));
      }
      if (ok)
        optimizer.step(model.parameters(), model.gradients(), lr);
      else
        ++skipped;  // every rank agrees on the statuses, so every rank skips
    }
    averaging.end_epoch(options.schedule.at(epoch + 1), comm);

    evaluation<float> test;
    for (std::size_t lo = test_lo; lo < test_hi; lo += batch) {
      const std::size_t n = std::min(batch, test_hi - lo);
      const std::uint32_t first = static_cast<std::uint32_t>(lo);
      for (std::size_t b = 0; b < n; ++b) test_items[b] = first + static_cast<std::uint32_t>(b);
      gather(data.test, std::span<const std::uint32_t>(test_items.data(), n), table, x, labels);
      const evaluation<float> e = model.evaluate(std::span<const float>(x.data(), n * image_size),
                                                 std::span<const std::uint8_t>(labels.data(), n));
      test.loss_sum += e.loss_sum;
      test.correct += e.correct;
    }
    float totals[3] = {static_cast<float>(train_loss), test.loss_sum, static_cast<float>(test.correct)};
    comm.allreduce_sum(totals);
    epoch_report report;
    report.epoch = epoch;
    report.lr = lr;
    report.train_loss = totals[0] / static_cast<double>(steps * workers);
    report.test_loss = totals[1] / static_cast<double>(test_count);
    report.test_accuracy = totals[2] / static_cast<double>(test_count);
    report.steps = steps;
    report.skipped_steps = skipped;
    report.sent = averaging.total_sent();
    report.high_levels = high_levels;
    report.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (rank == 0) result.epochs.push_back(report);
    if constexpr (checkpointable_averaging<averaging_type>) {
      if (!options.checkpoint.empty()) saver.save(comm, result.epochs);
    }
    if (rank == 0) on_epoch(report, std::as_const(averaging));
  }
  const std::span<const float> w = model.parameters();
  result.weights.assign(w.begin(), w.end());
  return result;
}

}  // namespace detail

/// Trains `options.epochs` epochs on `options.workers` threads. `make_averaging(layers)` is called
/// on every worker with the model's tensors (ids 0, 1, ...; name and shape) and returns that
/// worker's gradient_averaging object; `on_epoch(report, averaging)` is called on rank 0 after
/// every epoch (after its checkpoint is saved), and `on_epoch.resumed(averaging, reports)`, if it
/// has one, after a resume, with the reports of the epochs the checkpoint holds. Exceptions of
/// any worker are rethrown here.
template <class MakeAveraging, class OnEpoch = ignore_epoch>
train_result train(const dataset& data, const train_options& options, MakeAveraging make_averaging,
                   OnEpoch on_epoch = {}) {
  options.validate(data);
  const std::vector<float> table = detail::pixel_table(data.train, options.train_images(data));
  train_result result;
  bellows::collectives::local_group group(options.workers);
  group.run([&](bellows::collectives::local& comm) {
    train_result mine = detail::train_worker(data, options, table, comm, make_averaging, on_epoch);
    if (comm.rank() == 0) result = std::move(mine);
  });
  return result;
}

/// The same training as rank comm.rank() of comm.size() workers (options.workers is ignored):
/// every rank calls it with the same options. `on_epoch` is called on rank 0; the result holds
/// the weights on every rank and the epoch reports on rank 0.
template <bellows::Collective Coll, class MakeAveraging, class OnEpoch = ignore_epoch>
train_result train_rank(const dataset& data, const train_options& options, Coll& comm, MakeAveraging make_averaging,
                        OnEpoch on_epoch = {}) {
  train_options mine = options;
  mine.workers = comm.size();
  mine.validate(data);
  const std::vector<float> table = detail::pixel_table(data.train, mine.train_images(data));
  return detail::train_worker(data, mine, table, comm, make_averaging, on_epoch);
}

}  // namespace fmnist
