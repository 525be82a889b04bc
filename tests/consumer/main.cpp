// SPDX-License-Identifier: Apache-2.0
// Two workers average a small gradient through bellows; prints the result and exits 0 if right.
#include <bellows/bellows.hpp>

#include <cstdio>
#include <vector>

int main() {
  bellows::collectives::local_group group(2);
  bool right = true;
  group.run([&](bellows::collectives::local& comm) {
    bellows::identity<> averaging;
    auto state = averaging.make_state({0, "w", bellows::shape{2, 2}});
    std::vector<float> grad(4, comm.rank() == 0 ? 1.0f : 3.0f);
    const auto result = averaging.reduce(state, grad, comm);
    for (float g : grad) right = right && g == 2.0f;
    right = right && result.status == bellows::step_status::ok;
  });
  std::printf("consumer: average %s\n", right ? "ok" : "WRONG");
  return right ? 0 : 1;
}
