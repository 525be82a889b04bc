// SPDX-License-Identifier: Apache-2.0
// The device compressors' rescale(state, lr_old, lr_new), the device form of
// error_memory::rescale: after a step with feedback::scaled, every rank's memory becomes the old
// one times lr_old / lr_new, each element rounded as cpu::scale rounds it (the quotient in float,
// then one float product); a residual memory, an unchanged rate, and a rate that is not > 0
// (refused) leave it as it was.
#include <bellows/collectives/nccl.cuh>
#include <bellows/compressors/list.hpp>
#include <bellows/compressors/powersgd.cuh>
#include <bellows/compressors/powersgd.hpp>
#include <bellows/compressors/qsgd.cuh>
#include <bellows/compressors/qsgd.hpp>
#include <bellows/compressors/randk.cuh>
#include <bellows/compressors/randk.hpp>
#include <bellows/compressors/signsgd.cuh>
#include <bellows/compressors/signsgd.hpp>
#include <bellows/compressors/topk.cuh>
#include <bellows/compressors/topk.hpp>

#include <doctest/doctest.h>

#include <cstddef>
#include <type_traits>
#include <vector>

#include "../support/random.hpp"
#include "compressor_ranks.cuh"
#include "device_test.cuh"
#include "nccl_ranks.cuh"

namespace {

/// One step of C<cuda::executor>(params) on every rank, then rescale(lr_old, lr_new): the memory
/// is the old one times lr_old / lr_new when `scaled`, else unchanged; a rate of 0 raises.
template <template <class> class C, class Params>
void check_rescale(Params params, bellows::feedback kind) {
  params.feedback = kind;
  const bellows::layer_info layer{0, "fc", bellows::shape{24, 40}};
  const float lr_old = 0.1f, lr_new = 0.03f;
  bellows::test::check_every_rank([&](std::size_t rank, bellows::collectives::nccl& coll) {
    bellows::cuda::executor exec(coll.stream());
    C<bellows::cuda::executor> c(params, exec);
    auto st = c.make_state(layer);
    bellows::test::device_array<float> g(bellows::testing::normal_floats(layer.size(), rank + 11));
    bool ok = c.reduce(st, g.span(), coll).status == bellows::step_status::ok;
    const std::vector<float> before = bellows::test::memory_of(st.memory);
    ok &= !before.empty();
    std::vector<float> want = before;
    if (kind == bellows::feedback::scaled)
      for (float& e : want) e *= lr_old / lr_new;
    c.rescale(st, lr_old, lr_new);
    ok &= bellows::test::same_bytes(bellows::test::memory_of(st.memory), want);
    c.rescale(st, lr_new, lr_new);  // no change of rate
    ok &= bellows::test::same_bytes(bellows::test::memory_of(st.memory), want);
    ok &= bellows::test::raises<bellows::error>([&] { c.rescale(st, 0.0f, lr_new); }, "must be > 0");
    return ok && bellows::test::same_bytes(bellows::test::memory_of(st.memory), want);
  });
}

}  // namespace

TEST_CASE("cuda rescale: a scaled memory times lr_old / lr_new, as the CPU's; a residual one untouched" *
          doctest::skip(bellows::test::no_device())) {
  for (const auto kind : {bellows::feedback::scaled, bellows::feedback::residual}) {
    CAPTURE(bellows::to_string(kind));
    // every method of compressors/list.hpp with a device compressor and a memory, at its first example
    std::size_t checked = 0;
    bellows::for_each_method(bellows::compressor_methods{}, [&]<class M>(std::type_identity<M>) {
      if constexpr (M::on_device && requires(typename M::params p) { p.feedback; }) {  // a memory to rescale
        CAPTURE(M::name);
        check_rescale<M::template compressor>(M::examples[0], kind);
        ++checked;
      }
    });
    CHECK(checked == 5);  // top-k, rand-k, QSGD, PowerSGD, EF-signSGD
  }
}
