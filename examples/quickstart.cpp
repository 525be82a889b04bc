// SPDX-License-Identifier: Apache-2.0
#include <bellows/bellows.hpp>
#include <cstdio>
#include <vector>

int main() {
  bellows::collectives::local_group workers(4);  // 4 ranks as threads
  workers.run([](bellows::collectives::local& comm) {
    bellows::identity<> averaging;  // swap in any compressor
    auto layer = averaging.make_state({0, "fc1.weight", bellows::shape{2, 3}});
    std::vector<float> grad(6, float(comm.rank() + 1));  // rank r holds r + 1
    auto result = averaging.reduce(layer, grad, comm);
    if (comm.rank() == 0)
      std::printf("%s: mean %.2f, sent %llu bytes\n", bellows::to_string(result.status), grad[0],
                  static_cast<unsigned long long>(result.sent.bytes));
  });
}
