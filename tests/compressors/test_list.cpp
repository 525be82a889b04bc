// SPDX-License-Identifier: Apache-2.0
// The list of compressors and each method descriptor's promises: distinct names and codec ids,
// option fallbacks that are the library's defaults, settings that configure what they say, bad
// option text refused naming the option, and examples that build.
#include <bellows/compressors/list.hpp>
#include <bellows/cpu/executor.hpp>

#include <doctest/doctest.h>

#include <cstring>
#include <set>
#include <string>
#include <variant>
#include <vector>

#include "../support/random.hpp"

namespace {

/// describe() as comparable text.
template <class M>
std::vector<std::string> described(const typename M::params& p) {
  std::vector<std::string> out;
  for (const bellows::method_param& d : M::describe(p))
    std::visit(
        [&](const auto& v) {
          if constexpr (std::is_same_v<std::decay_t<decltype(v)>, std::string_view>)
            out.push_back(std::string(d.name) + "=" + std::string(v));
          else
            out.push_back(std::string(d.name) + "=" + std::to_string(v));
        },
        d.value);
  return out;
}

/// A CPU state's error memory as a vector (an error_memory, or PowerSGD's float_array).
template <class State>
std::vector<float> memory_of(const State& st) {
  std::span<const float> e;
  if constexpr (requires { st.memory.values(); })
    e = st.memory.values();
  else
    e = st.memory.span();
  return {e.begin(), e.end()};
}

bool same_bytes(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

}  // namespace

TEST_CASE("list: rescale is one member of every compressor with a memory: a scaled memory times lr_old / lr_new") {
  bellows::cpu::executor exec(1);
  bellows::archetypes::collective solo;
  const bellows::layer_info layer{0, "fc", bellows::shape{24, 40}};
  const float lr_old = 0.1f, lr_new = 0.03f;
  for (const auto kind : {bellows::feedback::scaled, bellows::feedback::residual}) {
    CAPTURE(bellows::to_string(kind));
    std::size_t checked = 0;
    bellows::for_each_method(bellows::compressor_methods{}, [&]<class M>(std::type_identity<M>) {
      if constexpr (requires(typename M::params p) { p.feedback; }) {
        CAPTURE(M::name);
        typename M::params params = M::examples[0];
        params.feedback = kind;
        auto c = M::make(params, exec);
        auto st = c.make_state(layer);
        auto g = bellows::testing::normal_floats(layer.size(), 11);
        CHECK(c.reduce(st, g, solo).status == bellows::step_status::ok);
        std::vector<float> want = memory_of(st);
        CHECK(!want.empty());
        if (kind == bellows::feedback::scaled)
          for (float& e : want) e *= lr_old / lr_new;
        c.rescale(st, lr_old, lr_new);
        CHECK(same_bytes(memory_of(st), want));
        c.rescale(st, lr_new, lr_new);  // no change of rate
        CHECK(same_bytes(memory_of(st), want));
        CHECK_THROWS_WITH_AS(c.rescale(st, 0.0f, lr_new), doctest::Contains("must be > 0"), bellows::error);
        CHECK(same_bytes(memory_of(st), want));
        ++checked;
      }
    });
    CHECK(checked == 5);  // top-k, rand-k, QSGD, PowerSGD, EF-signSGD
  }
}

TEST_CASE("list: every compressor once, by distinct names and codec ids in increasing order") {
  std::set<std::string> names;
  std::vector<int> ids;
  bellows::for_each_method(bellows::compressor_methods{}, [&](auto m) {
    using M = typename decltype(m)::type;
    names.insert(std::string(M::name));
    ids.push_back(M::codec.id);
    CHECK(std::string(M::codec.name) == std::string(M::name));
    CHECK(!M::summary.empty());
    CHECK(std::size(M::examples) >= 1);
  });
  CHECK(names.size() == bellows::compressor_methods::size);
  for (const char* expected : {"identity", "topk", "randk", "qsgd", "powersgd"}) CHECK(names.count(expected) == 1);
  for (std::size_t i = 1; i < ids.size(); ++i) CHECK(ids[i - 1] < ids[i]);
  CHECK(bellows::method_names(bellows::compressor_methods{}).find("topk, randk") != std::string::npos);
}

TEST_CASE("list: visit_method finds a method by name and only by name") {
  std::string seen;
  CHECK(bellows::visit_method(bellows::compressor_methods{}, "qsgd",
                              [&](auto m) { seen = std::string(decltype(m)::type::name); }));
  CHECK(seen == "qsgd");
  CHECK_FALSE(bellows::visit_method(bellows::compressor_methods{}, "qsg", [&](auto) { seen = "wrong"; }));
  CHECK(seen == "qsgd");
}

TEST_CASE("list: each option's fallback is the library's default, and settings configure what they name") {
  bellows::for_each_method(bellows::compressor_methods{}, [](auto m) {
    using M = typename decltype(m)::type;
    CAPTURE(M::name);
    const auto defaults = described<M>(typename M::params{});
    CHECK(described<M>(M::configure({})) == defaults);
    bellows::method_settings fallbacks;
    for (const bellows::method_option& o : M::options) {
      CAPTURE(o.name);
      CHECK(!o.help.empty());
      CHECK(o.flag == o.fallback.empty());
      if (!o.flag) fallbacks.set(o.name, std::string(o.fallback));
      // Text that is no value of the option is refused, naming it.
      bellows::method_settings bad;
      bad.set(o.name, "x!");
      const std::string option(o.name);
      CHECK_THROWS_WITH_AS((void)M::configure(bad), doctest::Contains(option.c_str()), bellows::error);
    }
    CHECK(described<M>(M::configure(fallbacks)) == defaults);
    // The level option, if any, is one of the options.
    if (!M::level.empty()) {
      bool found = false;
      for (const bellows::method_option& o : M::options) found = found || o.name == M::level;
      CHECK(found);
    }
  });
}

TEST_CASE("list: every example configuration builds a compressor") {
  bellows::for_each_method(bellows::compressor_methods{}, [](auto m) {
    using M = typename decltype(m)::type;
    CAPTURE(M::name);
    for (const auto& p : M::examples) CHECK_NOTHROW((void)M::make(p, bellows::cpu::executor::shared()));
  });
}

TEST_CASE("list: settings read numbers, whole numbers, flags and choices strictly") {
  bellows::method_settings s;
  s.set("ratio", "0.25").set("rank", "3").set("approximate", "").set("norm", "max-abs");
  CHECK(s.number("ratio", 1.0) == 0.25);
  CHECK(s.number("other", 0.5) == 0.5);
  CHECK(s.whole("rank", 0) == 3);
  CHECK(s.flag("approximate"));
  CHECK_FALSE(s.flag("per-rank"));
  CHECK(s.choice("norm", "l2|max-abs", "l2") == "max-abs");
  CHECK(s.choice("missing", "l2|max-abs", "l2") == "l2");
  s.set("rank", "3.5");
  CHECK_THROWS_WITH_AS((void)s.whole("rank", 0), doctest::Contains("rank"), bellows::error);
  s.set("rank", "-1");
  CHECK_THROWS_AS((void)s.whole("rank", 0), bellows::error);
  s.set("ratio", "0.25x");
  CHECK_THROWS_AS((void)s.number("ratio", 0), bellows::error);
  s.set("approximate", "yes");
  CHECK_THROWS_AS((void)s.flag("approximate"), bellows::error);
  CHECK_THROWS_WITH_AS((void)s.choice("norm", "l2|max", "l2"), doctest::Contains("l2|max"), bellows::error);
}
