// SPDX-License-Identifier: Apache-2.0
// Checkpoints of a Synchronizer at several ranks: four ranks (threads of a local_group) train two
// epochs of top-k 10% <-> 1% under Accordion and each saves its own file into one directory; four
// new ranks resume from those files and train on; then two ranks restart from the same directory
// at the other world size (the elastic restart: levels, detector and counters kept, error
// memories started fresh). Usage: synchronizer_resume [DIRECTORY] (default: a temporary one).
#include <bellows/bellows.hpp>

#include <cstdio>
#include <filesystem>
#include <random>
#include <span>
#include <string>
#include <vector>

namespace {

const bellows::shape weight{64, 32}, bias{64};

/// Registers the model's layers: on every rank, the same layers in the same order, and before
/// any load.
template <class Sync>
void add_layers(Sync& sync) {
  sync.add_layer("fc.weight", weight);
  sync.add_layer("fc.bias", bias);
}

/// Trains epochs [from, to) on made-up gradients; rank 0 prints each epoch's levels and traffic.
template <class Sync>
void train(Sync& sync, bellows::collectives::local& comm, std::size_t from, std::size_t to) {
  std::vector<float> gw(weight.size()), gb(bias.size());
  const std::vector<std::span<float>> grads{gw, gb};  // a step's gradient list: one span per layer
  for (std::size_t epoch = from; epoch < to; ++epoch) {
    std::mt19937 rng(static_cast<unsigned>(100 * epoch + comm.rank()));
    std::normal_distribution<float> normal(0.0f, 1.0f / static_cast<float>(epoch + 1));
    for (int step = 0; step < 5; ++step) {
      for (float& g : gw) g = normal(rng);
      for (float& g : gb) g = normal(rng);
      (void)sync.step(grads, comm);  // each gradient becomes the average over the ranks
    }
    (void)sync.end_epoch(0.1f, comm);
    if (comm.rank() == 0) {
      const bellows::layer_telemetry& w = sync.telemetry()[0];
      std::printf("  epoch %zu: fc.weight %s next (top-k %s), %llu steps, %llu bytes sent by rank 0\n", epoch + 1,
                  bellows::to_string(w.level), w.level == bellows::regime::critical ? "10%" : "1%",
                  static_cast<unsigned long long>(w.steps), static_cast<unsigned long long>(w.sent.bytes));
    }
  }
}

auto make_synchronizer() {
  return bellows::synchronizer(bellows::topk<>({.ratio = 0.1}), bellows::topk<>({.ratio = 0.01}),
                               bellows::accordion(bellows::accordion_params{.eta = 0.5f, .interval = 1}));
}

}  // namespace

int main(int argc, char** argv) {
  const std::filesystem::path dir =
      argc > 1 ? std::filesystem::path(argv[1]) : std::filesystem::temp_directory_path() / "bellows_resume_example";
  std::filesystem::remove_all(dir);

  std::printf("4 ranks, epochs 1-2, then each rank saves %s\n", dir.c_str());
  bellows::collectives::local_group four(4);
  four.run([&](bellows::collectives::local& comm) {
    auto sync = make_synchronizer();  // each rank builds its own, inside run
    add_layers(sync);
    train(sync, comm, 0, 2);
    sync.save(dir, comm);  // dir/rank<r>.ckpt, rank r's own error memories
  });

  std::printf("4 new ranks resume, epochs 3-4\n");
  four.run([&](bellows::collectives::local& comm) {
    auto sync = make_synchronizer();
    add_layers(sync);      // first the layers,
    sync.load(dir, comm);  // then this rank's file: refused for another rank or world size
    train(sync, comm, sync.epoch(), 4);
  });

  std::printf("2 ranks restart from the same files (elastic), epochs 3-4\n");
  bellows::collectives::local_group two(2);
  two.run([&](bellows::collectives::local& comm) {
    auto sync = make_synchronizer();
    add_layers(sync);
    sync.load_elastic(dir, comm);  // rank 0's file on every rank; memories start at zero
    train(sync, comm, sync.epoch(), 4);
  });
  std::filesystem::remove_all(dir);
}
