// SPDX-License-Identifier: Apache-2.0
// The list of compressors and each method descriptor's promises: distinct names and codec ids,
// option fallbacks that are the library's defaults, settings that configure what they say, bad
// option text refused naming the option, and examples that build.
#include <bellows/compressors/list.hpp>

#include <doctest/doctest.h>

#include <set>
#include <string>
#include <variant>
#include <vector>

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

}  // namespace

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
