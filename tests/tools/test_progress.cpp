// SPDX-License-Identifier: Apache-2.0
#include "bellows-bench/progress.hpp"

#include <doctest/doctest.h>

#include <chrono>
#include <sstream>
#include <string>

namespace tool = bellows::tool;

TEST_CASE("progress: silent when stderr is not a terminal, and before the delay") {
  std::ostringstream pipe, early;
  tool::progress not_terminal(pipe, false, 10, std::chrono::seconds(0));
  tool::progress too_soon(early, true, 10, std::chrono::hours(1));
  for (int i = 0; i < 10; ++i) {
    not_terminal.advance();
    too_soon.advance();
  }
  not_terminal.finish();
  too_soon.finish();
  CHECK(pipe.str().empty());
  CHECK(early.str().empty());
  CHECK(not_terminal.done() == 10);
}

TEST_CASE("progress: on a terminal past the delay, a bar with the count and label, cleared at the end") {
  std::ostringstream out;
  tool::progress bar(out, true, 4, std::chrono::seconds(0));
  bar.label("topk");
  bar.advance();
  CHECK(out.str() == "\r[#######                       ] 1/4 calls  topk\x1b[K");
  for (int i = 0; i < 3; ++i) bar.advance();  // throttled, but the last call always draws
  const std::string drawn = out.str();
  CHECK(drawn.substr(drawn.rfind('\r')) == "\r[##############################] 4/4 calls  topk\x1b[K");
  bar.finish();
  CHECK(out.str().substr(drawn.size()) == "\r\x1b[K");
}
