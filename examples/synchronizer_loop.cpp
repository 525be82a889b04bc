// SPDX-License-Identifier: Apache-2.0
// bellows::synchronizer inside a trainer's own loop, over a collective the trainer wrote itself.
// Four ranks (threads here; processes with MPI or NCCL in a real trainer) fit a linear model
// y = W x + b by SGD, each on its own samples, with the gradients averaged by PowerSGD at rank 4
// in critical regimes and rank 1 elsewhere, as Accordion decides per layer every 2 epochs.
#include <bellows/bellows.hpp>

#include <algorithm>
#include <barrier>
#include <cmath>
#include <cstdio>
#include <random>
#include <span>
#include <thread>
#include <vector>

/// A user-written Collective: the ranks are threads that show each other their buffers through a
/// shared table and keep in step with a barrier. Sums run in rank order, so every rank gets the
/// same bits. An MPI or NCCL trainer writes the same four members around its own calls.
class thread_collective {
public:
  struct group {
    explicit group(std::size_t ranks) : sync(static_cast<std::ptrdiff_t>(ranks)), posts(ranks) {}
    std::barrier<> sync;
    std::vector<std::span<const std::byte>> posts;  // what each rank offers in this call
  };

  thread_collective(group& g, std::size_t rank) : group_(&g), rank_(rank) {}
  [[nodiscard]] std::size_t rank() const { return rank_; }
  [[nodiscard]] std::size_t size() const { return group_->posts.size(); }

  void allreduce_sum(std::span<float> v) {
    offer(std::as_bytes(v));
    sum_.assign(v.size(), 0.0f);
    for (const std::span<const std::byte> p : group_->posts) {
      const auto* other = reinterpret_cast<const float*>(p.data());
      for (std::size_t i = 0; i < v.size(); ++i) sum_[i] += other[i];
    }
    group_->sync.arrive_and_wait();  // everyone has read every v before anyone overwrites its own
    std::ranges::copy(sum_, v.begin());
  }

  void allgather(std::span<const std::byte> mine, bellows::gather_buffer& out) {
    offer(mine);
    std::vector<std::size_t> sizes;
    for (const std::span<const std::byte> p : group_->posts) sizes.push_back(p.size());
    out.resize(sizes);
    for (std::size_t r = 0; r < sizes.size(); ++r) std::ranges::copy(group_->posts[r], out.block(r).begin());
    group_->sync.arrive_and_wait();
  }

private:
  void offer(std::span<const std::byte> bytes) {
    group_->posts[rank_] = bytes;
    group_->sync.arrive_and_wait();  // every rank's offer is in the table
  }

  group* group_;
  std::size_t rank_;
  std::vector<float> sum_;
};
static_assert(bellows::Collective<thread_collective>);

constexpr std::size_t inputs = 64, outputs = 32, batch = 16, steps = 50, epochs = 8;

/// The learning rate of an epoch: 0.05, then 0.005 from epoch 6 on.
float learning_rate(std::size_t epoch) { return epoch < 6 ? 0.05f : 0.005f; }

/// Rank `rank`'s gradients of the mean squared error 0.5 |W x + b - y|^2 over one batch drawn
/// around the true model y = x_0 + ... (row o of the true W holds 1 at column o); returns the loss.
float gradients(std::span<const float> w, std::span<const float> b, std::span<float> gw, std::span<float> gb,
                std::mt19937& rng) {
  std::normal_distribution<float> normal;
  std::ranges::fill(gw, 0.0f);
  std::ranges::fill(gb, 0.0f);
  float loss = 0;
  std::vector<float> x(inputs);
  for (std::size_t s = 0; s < batch; ++s) {
    for (float& v : x) v = normal(rng);
    for (std::size_t o = 0; o < outputs; ++o) {
      float err = b[o] - x[o] - 0.1f * normal(rng);  // prediction minus noisy target
      for (std::size_t i = 0; i < inputs; ++i) err += w[o * inputs + i] * x[i];
      loss += 0.5f * err * err / batch;
      for (std::size_t i = 0; i < inputs; ++i) gw[o * inputs + i] += err * x[i] / batch;
      gb[o] += err / batch;
    }
  }
  return loss;
}

int main() {
  constexpr std::size_t ranks = 4;
  thread_collective::group group(ranks);
  std::vector<std::jthread> threads;
  for (std::size_t r = 0; r < ranks; ++r)
    threads.emplace_back([&group, r] {
      thread_collective comm(group, r);
      std::mt19937 rng(static_cast<unsigned>(r));  // each rank its own data
      std::vector<float> w(outputs * inputs, 0.0f), b(outputs, 0.0f), gw(w.size()), gb(b.size());
      // --- the synchronizer in the trainer's loop ---
      bellows::synchronizer sync(bellows::powersgd<>({.rank = 4}), bellows::powersgd<>({.rank = 1}),
                                 bellows::accordion({.eta = 0.5f, .interval = 2}));
      sync.add_layer("w", bellows::shape{outputs, inputs});  // every rank, same layers, same order
      sync.add_layer("b", bellows::shape{outputs});          // 1-D: PowerSGD sends it uncompressed
      const std::vector<std::span<float>> grads{gw, gb};
      for (std::size_t epoch = 0; epoch < epochs; ++epoch) {
        const float lr = learning_rate(epoch);
        float loss = 0;
        for (std::size_t step = 0; step < steps; ++step) {
          loss += gradients(w, b, gw, gb, rng) / steps;
          const auto status = sync.step(grads, comm);  // gw, gb become the averaged gradients
          if (std::ranges::any_of(status, [](auto s) { return s != bellows::step_status::ok; })) continue;
          for (std::size_t i = 0; i < w.size(); ++i) w[i] -= lr * gw[i];
          for (std::size_t i = 0; i < b.size(); ++i) b[i] -= lr * gb[i];
        }
        sync.end_epoch(learning_rate(epoch + 1), comm);  // the next epoch's learning rate
        if (r == 0)
          std::printf("epoch %zu: loss %.4f, w at %s level next, %llu floats sent\n", epoch + 1, loss,
                      sync.telemetry()[0].level == bellows::regime::critical ? "low (rank 4)" : "high (rank 1)",
                      static_cast<unsigned long long>(sync.total_sent().elements));
      }
    });
}
