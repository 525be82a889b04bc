// SPDX-License-Identifier: Apache-2.0
// The progress bar bellows-bench draws on stderr: only on a terminal, and only once a run has
// lasted a second, so short runs and redirected output stay clean.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <ostream>
#include <string>
#include <utility>

namespace bellows::tool {

class progress {
public:
  using clock = std::chrono::steady_clock;

  /// `total` calls in all; nothing is drawn unless `terminal`, nor before `delay` has passed.
  progress(std::ostream& out, bool terminal, std::size_t total, clock::duration delay = std::chrono::seconds(1))
      : out_(&out), terminal_(terminal), total_(std::max<std::size_t>(total, 1)), delay_(delay) {}

  /// What is running now (the method), shown beside the bar.
  void label(std::string text) { label_ = std::move(text); }

  /// One more call done; redraws at most ten times a second.
  void advance() {
    ++done_;
    if (!terminal_) return;
    const clock::time_point now = clock::now();
    if (now - start_ < delay_ || (drawn_ && now - last_ < std::chrono::milliseconds(100) && done_ < total_)) return;
    last_ = now;
    drawn_ = true;
    constexpr std::size_t width = 30;
    const std::size_t filled = width * std::min(done_, total_) / total_;
    *out_ << '\r' << '[' << std::string(filled, '#') << std::string(width - filled, ' ') << "] "
          << std::min(done_, total_) << '/' << total_ << " calls  " << label_ << "\x1b[K" << std::flush;
  }

  /// Clears the bar if one was drawn.
  void finish() {
    if (drawn_) *out_ << "\r\x1b[K" << std::flush;
    drawn_ = false;
  }

  [[nodiscard]] std::size_t done() const noexcept { return done_; }

private:
  std::ostream* out_;
  bool terminal_;
  std::size_t total_;
  clock::duration delay_;
  clock::time_point start_ = clock::now();
  clock::time_point last_{};
  std::size_t done_ = 0;
  bool drawn_ = false;
  std::string label_;
};

}  // namespace bellows::tool
