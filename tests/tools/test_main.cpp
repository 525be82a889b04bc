// SPDX-License-Identifier: Apache-2.0
// The bellows-bench command line, run as a user runs it: exit codes, messages, JSON, and the
// figures of every method against the library called directly on the same data.
#include <bellows/collectives/local.hpp>
#include <bellows/compressors/identity.hpp>
#include <bellows/compressors/powersgd.hpp>
#include <bellows/compressors/qsgd.hpp>
#include <bellows/compressors/randk.hpp>
#include <bellows/compressors/topk.hpp>

#include <doctest/doctest.h>
#include <nlohmann/json.hpp>

#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <sstream>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "../support/random.hpp"
#include "bellows-bench/npy.hpp"

namespace fs = std::filesystem;
namespace npy = bellows::tool::npy;
using json = nlohmann::json;

namespace {

/// A directory of its own for each test case, removed at the end.
struct scratch {
  fs::path dir = fs::temp_directory_path() /
                 ("bellows_bench_cli_" + std::to_string(::getpid()) + "_" + std::to_string(counter()++));
  scratch() { fs::create_directories(dir); }
  ~scratch() { fs::remove_all(dir); }
  static int& counter() {
    static int c = 0;
    return c;
  }
  [[nodiscard]] std::string operator/(const std::string& name) const { return (dir / name).string(); }
};

struct outcome {
  int code = -1;
  std::string out, err;
};

std::string slurp(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

/// Runs bellows-bench with `args` (a shell fragment) and collects its exit code and output.
outcome bench(const scratch& s, const std::string& args) {
  const std::string cmd = std::string("'") + BELLOWS_BENCH + "' " + args + " >'" + (s / "stdout") + "' 2>'" +
                          (s / "stderr") + "' </dev/null";
  const int status = std::system(cmd.c_str());
  outcome o;
  o.code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  o.out = slurp(s / "stdout");
  o.err = slurp(s / "stderr");
  return o;
}

/// bench() for a run that must succeed, with --json added: its parsed output.
json bench_json(const scratch& s, const std::string& args) {
  const outcome o = bench(s, args + " --json");
  INFO(o.err);
  REQUIRE(o.code == 0);
  return json::parse(o.out);
}

void write_bytes(const std::string& path, const std::vector<std::byte>& bytes) {
  std::ofstream(path, std::ios::binary)
      .write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
}

/// A version 1.0 file with a header dict written by hand, for malformed cases.
std::vector<std::byte> npy_with_header(std::string dict, std::size_t data_bytes) {
  dict += '\n';
  std::vector<std::byte> b(10 + dict.size() + data_bytes, std::byte{0});
  std::memcpy(b.data(), "\x93NUMPY\x01\x00", 8);
  b[8] = static_cast<std::byte>(dict.size() & 0xFF);
  b[9] = static_cast<std::byte>(dict.size() >> 8);
  std::memcpy(b.data() + 10, dict.data(), dict.size());
  return b;
}

/// `count` seeded gradients of `shape` written as g0.npy, g1.npy, ..., and the words naming them.
struct sequence {
  std::vector<std::vector<float>> grads;
  std::string files;
};

sequence write_sequence(const scratch& s, const bellows::shape& shape, std::size_t count, std::uint64_t seed) {
  sequence q;
  for (std::size_t f = 0; f < count; ++f) {
    q.grads.push_back(bellows::testing::normal_floats(shape.size(), seed + f));
    const std::string path = s / ("g" + std::to_string(f) + ".npy");
    npy::write(path, shape, q.grads.back());
    q.files += "'" + path + "' ";
  }
  return q;
}

/// What the library gives when called directly: W ranks through the local collective, each
/// holding gradient t of `grads` at step t, through one state per rank. Per step, rank 0's
/// bytes and the relative error of its averaged result, computed here in double.
struct direct_result {
  std::vector<std::uint64_t> bytes;
  std::vector<double> rel_error;
  std::vector<float> last;
};

template <class Make>
direct_result direct(const std::vector<std::vector<float>>& grads, const bellows::shape& shape, std::size_t workers,
                     std::size_t steps, Make make) {
  direct_result res;
  bellows::cpu::executor exec(1);
  bellows::collectives::local_group group(workers);
  group.run([&](bellows::collectives::local& comm) {
    auto c = make(exec);
    auto st = c.make_state({0, "g", shape});
    for (std::size_t t = 0; t < steps; ++t) {
      const std::vector<float>& g = grads[t % grads.size()];
      std::vector<float> buf = g;
      const bellows::reduce_result r = c.reduce(st, buf, comm);
      if (comm.rank() != 0) continue;
      double diff = 0, norm = 0;
      for (std::size_t i = 0; i < g.size(); ++i) {
        diff += (double{g[i]} - buf[i]) * (double{g[i]} - buf[i]);
        norm += double{g[i]} * g[i];
      }
      res.bytes.push_back(r.sent.bytes);
      res.rel_error.push_back(std::sqrt(diff / norm));
      res.last = buf;
    }
  });
  return res;
}

/// Checks the tool's JSON figures for one method against the direct computation.
void check_against(const json& m, const direct_result& d, std::size_t elements) {
  double bytes = 0;
  for (const std::uint64_t b : d.bytes) bytes += static_cast<double>(b);
  bytes /= static_cast<double>(d.bytes.size());
  CHECK(m["bytes_sent"].get<double>() == bytes);
  CHECK(m["compression_ratio"].get<double>() == doctest::Approx(4.0 * static_cast<double>(elements) / bytes));
  const auto per_step = m["rel_error_per_step"].get<std::vector<double>>();
  REQUIRE(per_step.size() == d.rel_error.size());
  for (std::size_t t = 0; t < per_step.size(); ++t) CHECK(per_step[t] == doctest::Approx(d.rel_error[t]).epsilon(1e-9));
}

/// check_against for compressor C built from parameters p, as the tool builds it from its options.
template <class C>
void check_method(const json& m, const sequence& q, const bellows::shape& shape, std::size_t workers, std::size_t steps,
                  const std::remove_cvref_t<decltype(std::declval<const C&>().params())>& p) {
  check_against(m, direct(q.grads, shape, workers, steps, [&](bellows::cpu::executor& e) { return C(p, e); }),
                shape.size());
}

const char* const usage = "usage: bellows-bench";

}  // namespace

TEST_CASE("cli: --help lists every method and exits 0; --version prints the version") {
  scratch s;
  const outcome help = bench(s, "--help");
  CHECK(help.code == 0);
  CHECK(help.out.find(usage) != std::string::npos);
  for (const char* m : {"identity", "topk", "randk", "powersgd", "qsgd"})
    CHECK(help.out.find(std::string("\n  ") + m + " ") != std::string::npos);
  CHECK(help.out.find("Every rank holds the same gradient") != std::string::npos);
  const outcome version = bench(s, "--version");
  CHECK(version.code == 0);
  CHECK(version.out.find('.') != std::string::npos);
}

TEST_CASE("cli: usage errors and bad method configurations exit 2 with the message and the usage line") {
  scratch s;
  npy::write(s / "g.npy", bellows::shape{4, 5}, bellows::testing::normal_floats(20, 1));
  const std::string g = "'" + (s / "g.npy") + "' ";
  const std::pair<std::string, const char*> cases[] = {
    {"", "no method"},
    {g, "no method"},
    {"--method identity", "no input"},
    {g + "--method", "--method needs a NAME"},
    {g + "--method nosuch", "unknown method 'nosuch'"},
    {g + "--synthetic normal --shape 4x4 --method identity", "not both"},
    {"--synthetic normal --method identity", "--synthetic needs --shape"},
    {g + "--shape 4x4 --method identity", "--shape goes with --synthetic"},
    {"--synthetic normal --shape 4x0 --method identity", "a dimension is 0"},
    {"--synthetic gamma --shape 4 --method identity", "--synthetic"},
    {g + "--method identity --steps 0", "--steps"},
    {g + "--method identity --workers many", "--workers"},
    {g + "--method identity --backend tpu", "--backend"},
#if BELLOWS_BENCH_CUDA
    {g + "--method topk --backend cuda --workers 2", "--backend cuda measures one rank: give --workers 1"},
#else
    {g + "--method identity --backend cuda", "not built with CUDA"},
#endif
    {g + "--method identity --error-feedback sometimes", "--error-feedback"},
    {g + "--method identity --bogus", "--bogus"},
    {g + "--method identity --out /nonexistent/o.npy",
     "--out /nonexistent/o.npy: /nonexistent is not a directory this process can write to"},
    {g + "--method powersgd --rank 0", "--method powersgd: powersgd: rank must be >= 1, got 0"},
    {g + "--method qsgd --bits 3", "--method qsgd: qsgd: bits must be 2, 4 or 8, got 3"},
    {g + "--method qsgd --bucket 0", "bucket must be in [1, 2^24), got 0"},
    {g + "--method qsgd --norm l1", "--norm"},
    {g + "--method powersgd --rank two", "--method powersgd: option rank: 'two' is not a whole number"},
    {g + "--ratio 0.1 --method powersgd", "--ratio"},
    {g + "--method topk --ratio 0", "--method topk: topk: ratio must be in (0, 1], got 0"},
    {g + "--method randk --ratio 1.5", "--method randk: randk: ratio must be in (0, 1], got 1.5"},
    {g + "--method randk --unbiased --error-feedback residual", "unbiased scaling needs feedback none"},
  };
  for (const auto& [args, phrase] : cases) {
    CAPTURE(args);
    const outcome o = bench(s, args);
    CHECK(o.code == 2);
    CHECK(o.out.empty());
    CHECK(o.err.find(phrase) != std::string::npos);
    CHECK(o.err.find(usage) != std::string::npos);
    if (o.err.find(phrase) == std::string::npos) MESSAGE(o.err);
  }
}

TEST_CASE("cli: --model models a whole model's step per layer and per bucket, beside DDP; its usage errors") {
  scratch s;
  const json j = bench_json(s, "--model resnet50 --workers 8 --link 30,1.25 --method powersgd --rank 4 --method qsgd");
  CHECK(j["tensors"] == 161);
  CHECK(j["parameters"] == 25557032);
  CHECK(j["workers"] == 8);
  CHECK(j["ddp_fp32"]["calls"] == j["buckets"]);
  CHECK(j["ddp_fp32"]["bytes_handed"].get<double>() == 4.0 * 25557032);
  REQUIRE(j["methods"].size() == 2);
  for (const json& m : j["methods"]) {
    CAPTURE(m["name"].get<std::string>());
    CHECK(m["per_bucket"]["calls"].get<int>() <= 16);  // the target at W = 8
    CHECK(m["per_layer"]["calls"].get<int>() >= 161);
    CHECK(m["per_bucket"]["modeled_s"].get<double>() < m["per_layer"]["modeled_s"].get<double>());
    CHECK(m["per_bucket"]["modeled_s"].get<double>() <= m["per_bucket"]["modeled_ring_s"].get<double>());
  }
  const outcome table = bench(s, "--model bert-base --workers 64 --method topk --method topk --exchange leader");
  CHECK(table.code == 0);
  CHECK(table.out.find("model: bert-base, 199 tensors, 109482240 parameters") != std::string::npos);
  CHECK(table.out.find("ddp fp32") != std::string::npos);
  // each method's settings follow its rows, in its order: the two top-k tell apart
  const std::size_t gather =
      table.out.find("  ratio 0.01, mode exact, error_feedback residual, exchange gather, owner_memory on\n");
  const std::size_t leader =
      table.out.find("  ratio 0.01, mode exact, error_feedback residual, exchange leader, owner_memory on\n");
  CHECK(gather != std::string::npos);
  CHECK(leader != std::string::npos);
  CHECK(gather < leader);
  const std::pair<std::string, const char*> cases[] = {
      {"--model resnet50", "no method"},
      {"--model resnet50 --method identity --link 30", "--link 30: give LATENCY_US,BANDWIDTH_GBPS"},
      {"--model resnet50 --method identity --link 30,-1", "the bandwidth > 0"},
      {"--model resnet50 --synthetic normal --shape 4 --method identity", "--model models a whole step"},
      {"--model resnet50 --method powersgd --rank 0", "--method powersgd: powersgd: rank must be >= 1, got 0"},
  };
  for (const auto& [args, phrase] : cases) {
    CAPTURE(args);
    const outcome o = bench(s, args);
    CHECK(o.code == 2);
    CHECK(o.err.find(phrase) != std::string::npos);
  }
  const outcome missing = bench(s, "--model '" + (s / "none.json") + "' --method identity");
  CHECK(missing.code == 3);
  CHECK(missing.err.find("neither a built-in model") != std::string::npos);
}

TEST_CASE("cli: --backend cuda measures the device compressors, or says why it cannot") {
  scratch s;
  npy::write(s / "g.npy", bellows::shape{64, 48}, bellows::testing::normal_floats(64 * 48, 4));
  const std::string g = "'" + (s / "g.npy") + "' --steps 2 --repeats 2 --backend cuda ";
  const outcome o = bench(s, g + "--method topk --ratio 0.1 --method qsgd --bits 4 --json");
#if BELLOWS_BENCH_CUDA
  if (o.code == 1) {  // built with CUDA, no device here
    CHECK(o.err == "bellows-bench: --backend cuda: no CUDA device\n");
    CHECK(o.out.empty());
    return;
  }
  INFO(o.err);
  REQUIRE(o.code == 0);
  const json doc = json::parse(o.out);
  CHECK(doc["config"]["backend"] == "cuda");
  REQUIRE(doc["methods"].size() == 2);
  // the device compressors are the CPU's: the same traffic, and distortion within rounding
  const json cpu =
      bench_json(s, "'" + (s / "g.npy") + "' --steps 2 --repeats 2 --method topk --ratio 0.1 --method qsgd --bits 4");
  for (std::size_t m = 0; m < 2; ++m) {
    CHECK(doc["methods"][m]["bytes_sent"] == cpu["methods"][m]["bytes_sent"]);
    CHECK(doc["methods"][m]["rel_error"].get<double>() ==
          doctest::Approx(cpu["methods"][m]["rel_error"].get<double>()).epsilon(1e-5));
    CHECK(doc["methods"][m]["x_floor"].get<double>() > 0);
  }
  // identity is on the device too (written once over the executor): the CPU's traffic, no error
  const outcome identity = bench(s, g + "--method identity --json");
  REQUIRE(identity.code == 0);
  const json id = json::parse(identity.out);
  const json id_cpu = bench_json(s, "'" + (s / "g.npy") + "' --steps 2 --repeats 2 --method identity");
  CHECK(id["methods"][0]["bytes_sent"] == id_cpu["methods"][0]["bytes_sent"]);
  CHECK(id["methods"][0]["rel_error"].get<double>() == 0.0);
#else
  CHECK(o.code == 2);
  CHECK(o.err.find("not built with CUDA") != std::string::npos);
#endif
}

TEST_CASE("cli: malformed and unusable input files exit 3 with a message naming the file and the problem") {
  scratch s;
  const std::string dict_end = "'fortran_order': False, 'shape': (2, 3), }";
  write_bytes(s / "magic.npy", {std::byte{'P'}, std::byte{'K'}, std::byte{3}, std::byte{4}, std::byte{0}, std::byte{0},
                                std::byte{0}, std::byte{0}, std::byte{0}, std::byte{0}});
  write_bytes(s / "fortran.npy", npy_with_header("{'descr': '<f4', 'fortran_order': True, 'shape': (2, 3), }", 24));
  write_bytes(s / "dtype.npy", npy_with_header("{'descr': '<f8', " + dict_end, 48));
  write_bytes(s / "truncated.npy", npy_with_header("{'descr': '<f4', " + dict_end, 23));
  write_bytes(s / "overflow.npy",
              npy_with_header("{'descr': '<f4', 'fortran_order': False, 'shape': (4294967296, 4294967297), }", 24));
  std::vector<float> with_nan = bellows::testing::normal_floats(6, 2);
  with_nan[4] = std::nanf("");
  npy::write(s / "nan.npy", bellows::shape{2, 3}, with_nan);
  npy::write(s / "a.npy", bellows::shape{2, 3}, bellows::testing::normal_floats(6, 3));
  npy::write(s / "b.npy", bellows::shape{3, 2}, bellows::testing::normal_floats(6, 4));
  const std::pair<std::string, const char*> cases[] = {
      {"magic.npy", "not an .npy file"},
      {"fortran.npy", "Fortran order"},
      {"dtype.npy", "unsupported dtype '<f8' (float64)"},
      {"truncated.npy", "truncated: shape (2, 3) of float32 needs 24 data bytes, the file has 23"},
      {"overflow.npy", "more elements than a size_t can count"},
      {"missing.npy", "no such file"},
      {"nan.npy", "element 4 is nan"},
      {"a.npy' '" + (s / "b.npy"), "shape 3x2 differs from"},
  };
  for (const auto& [file, phrase] : cases) {
    CAPTURE(file);
    const outcome o = bench(s, "'" + (s / file) + "' --method identity");
    CHECK(o.code == 3);
    CHECK(o.err.rfind("bellows-bench: " + s.dir.string(), 0) == 0);
    CHECK(o.err.find(phrase) != std::string::npos);
    CHECK(o.err.find(usage) == std::string::npos);
    if (o.err.find(phrase) == std::string::npos) MESSAGE(o.err);
  }
}

TEST_CASE("cli: --json parses and holds every field of the table, the input and the configuration") {
  scratch s;
  npy::write(s / "g.npy", bellows::shape{8, 6}, bellows::testing::normal_floats(48, 5));
  const json doc = bench_json(s, "'" + (s / "g.npy") + "' --method identity --steps 3 --workers 2 --repeats 2");
  CHECK(doc["tool"] == "bellows-bench");
  CHECK(doc["input"]["shape"] == json::array({8, 6}));
  CHECK(doc["input"]["elements"] == 48);
  CHECK(doc["input"]["bytes"] == 192);
  CHECK(doc["input"]["gradients"][0]["source"] == s / "g.npy");
  CHECK(doc["input"]["gradients"][0]["dtype"] == "float32");
  const json& c = doc["config"];
  CHECK(c["steps"] == 3);
  CHECK(c["workers"] == 2);
  CHECK(c["repeats"] == 2);
  CHECK(c["backend"] == "cpu");
  CHECK(c["threads"].get<int>() >= 1);
  CHECK(c["seed"] == 0);
  REQUIRE(doc["methods"].size() == 1);
  const json& m = doc["methods"][0];
  for (const char* key : {"name", "params", "bytes_sent", "compression_ratio", "values_sent", "kept", "rel_error",
                          "cosine", "cumulative_rel_error", "seconds_per_call", "floor_seconds", "x_floor",
                          "timed_calls", "non_finite_steps", "rel_error_per_step", "cosine_per_step"}) {
    CAPTURE(key);
    CHECK(m.contains(key));
  }
  CHECK(m["name"] == "identity");
  CHECK(m["timed_calls"] == 2);  // max(steps, repeats + 1) - 1 warm-up
  CHECK(m["rel_error_per_step"].size() == 3);
  CHECK(m["seconds_per_call"].get<double>() > 0);
  CHECK(m["x_floor"].get<double>() ==
        doctest::Approx(m["seconds_per_call"].get<double>() / m["floor_seconds"].get<double>()));
  CHECK(m["non_finite_steps"] == 0);
}

TEST_CASE("cli: the table names the input and each method, and the figures' meaning") {
  scratch s;
  const outcome o = bench(s, "--synthetic laplace --shape 16x16 --method identity --repeats 1");
  REQUIRE(o.code == 0);
  CHECK(o.out.find("input: synthetic laplace (seed 0) (float32); shape 16x16") == 0);
  const std::size_t header = o.out.find("\nmethod ");
  REQUIRE(header != std::string::npos);
  std::istringstream words(o.out.substr(header + 1, o.out.find('\n', header + 1) - header - 1));
  const std::vector<std::string> columns{std::istream_iterator<std::string>(words), {}};
  CHECK(columns == std::vector<std::string>{"method", "parameters", "bytes/step", "ratio", "rel", "err", "cosine",
                                            "ms/call", "floor", "ms", "x_floor"});
  CHECK(o.out.find("\nidentity  -") != std::string::npos);
  CHECK(o.out.find("cum err") == std::string::npos);  // one step: nothing accumulates
  CHECK(o.err.empty());                               // no progress bar when stderr is a file
}

TEST_CASE("cli: identity round trip against the library, W = 1 and 3, several files as a sequence") {
  scratch s;
  const bellows::shape shape{12, 10};
  const sequence q = write_sequence(s, shape, 2, 20);
  for (const std::size_t w : {1u, 3u}) {
    CAPTURE(w);
    const json m = bench_json(s, q.files + "--method identity --steps 3 --workers " + std::to_string(w) + " --out '" +
                                     (s / "out.npy") + "'")["methods"][0];
    const direct_result d =
        direct(q.grads, shape, w, 3, [](bellows::cpu::executor& e) { return bellows::identity<>(e); });
    check_against(m, d, shape.size());
    CHECK(m["out"] == s / "out.npy");
    const npy::array written = npy::read(s / "out.npy");
    CHECK(written.shape == shape);
    CHECK(written.values == d.last);
  }
}

TEST_CASE("cli: float16 input is measured on its exact float32 values") {
  scratch s;
  // float16 patterns: 1.0, -2.0, 0.5, the smallest subnormal, 65504, and 1 + 2^-10.
  const std::uint16_t halves[] = {0x3C00, 0xC000, 0x3800, 0x0001, 0x7BFF, 0x3C01};
  std::vector<std::byte> file = npy_with_header("{'descr': '<f2', 'fortran_order': False, 'shape': (3, 2), }", 12);
  std::memcpy(file.data() + file.size() - 12, halves, 12);
  write_bytes(s / "h.npy", file);
  const json doc = bench_json(s, "'" + (s / "h.npy") + "' --method identity --out '" + (s / "o.npy") + "'");
  CHECK(doc["input"]["gradients"][0]["dtype"] == "float16");
  CHECK(npy::read(s / "o.npy").values == std::vector<float>{1.0f, -2.0f, 0.5f, 0x1p-24f, 65504.0f, 1.0f + 0x1p-10f});
}

TEST_CASE("cli: --out with several methods writes one file per method; synthetic input is seeded") {
  scratch s;
  const std::string common = "--synthetic lognormal --shape 5x7 --repeats 1 --method identity --method identity";
  REQUIRE(bench(s, common + " --seed 9 --out '" + (s / "a.npy") + "'").code == 0);
  REQUIRE(bench(s, common + " --seed 9 --out '" + (s / "b.npy") + "'").code == 0);
  REQUIRE(bench(s, common + " --seed 10 --out '" + (s / "c.npy") + "'").code == 0);
  const auto a1 = npy::read(s / "a.1.identity.npy").values;
  CHECK(a1 == npy::read(s / "a.2.identity.npy").values);
  CHECK(a1 == npy::read(s / "b.1.identity.npy").values);
  CHECK(a1 != npy::read(s / "c.1.identity.npy").values);
}

TEST_CASE("cli: powersgd round trip against the library, with and without error feedback") {
  scratch s;
  const bellows::shape shape{24, 4, 5};  // rows 24, columns 20: compressed at rank 2
  const sequence q = write_sequence(s, shape, 2, 30);
  for (const std::size_t w : {1u, 2u}) {
    CAPTURE(w);
    const json doc = bench_json(s, q.files + "--steps 3 --seed 5 --workers " + std::to_string(w) +
                                       " --method powersgd --rank 2 --method powersgd --rank 3 --error-feedback none");
    const json& with = doc["methods"][0];
    const json& without = doc["methods"][1];
    CHECK(with["params"] == json{{"rank", 2}, {"error_feedback", "residual"}});
    CHECK(without["params"] == json{{"rank", 3}, {"error_feedback", "none"}});
    CHECK(with["compressed"] == true);
    check_method<bellows::powersgd<>>(with, q, shape, w, 3, {.rank = 2, .seed = 5});
    check_method<bellows::powersgd<>>(without, q, shape, w, 3,
                                      {.rank = 3, .feedback = bellows::feedback::none, .seed = 5});
  }
}

TEST_CASE("cli: powersgd leaves a small matrix uncompressed, and says so") {
  scratch s;
  npy::write(s / "g.npy", bellows::shape{3, 4}, bellows::testing::normal_floats(12, 1));
  const outcome table = bench(s, "'" + (s / "g.npy") + "' --repeats 1 --method powersgd --rank 2");
  REQUIRE(table.code == 0);
  CHECK(table.out.find("note: powersgd leaves a tensor of this shape uncompressed") != std::string::npos);
  const json m = bench_json(s, "'" + (s / "g.npy") + "' --repeats 1 --method powersgd --rank 2")["methods"][0];
  CHECK(m["compressed"] == false);
  CHECK(m["rel_error"] == 0.0);
}

TEST_CASE("cli: qsgd round trip against the library, W = 1 and 3, with the global --error-feedback") {
  scratch s;
  const bellows::shape shape{300};
  const sequence q = write_sequence(s, shape, 1, 40);
  for (const std::size_t w : {1u, 3u}) {
    CAPTURE(w);
    const json doc = bench_json(s, q.files + "--steps 2 --error-feedback residual --workers " + std::to_string(w) +
                                       " --method qsgd --bits 4 --bucket 64 --method qsgd --bits 2"
                                       " --bucket 50 --norm max-abs --error-feedback none");
    CHECK(doc["methods"][0]["params"] == json{{"bits", 4},
                                              {"bucket", 64},
                                              {"norm", "l2"},
                                              {"error_feedback", "residual"},
                                              {"exchange", "gather"},
                                              {"owner_memory", "off"}});
    check_method<bellows::qsgd<>>(doc["methods"][0], q, shape, w, 2,
                                  {.bits = 4, .bucket = 64, .feedback = bellows::feedback::residual});
    check_method<bellows::qsgd<>>(doc["methods"][1], q, shape, w, 2,
                                  {.bits = 2, .bucket = 50, .norm = bellows::qsgd_norm::max_abs});
  }
}

TEST_CASE("cli: topk round trip against the library: exact and approximate, with and without memory, by leader") {
  scratch s;
  const bellows::shape shape{40, 25};
  const sequence q = write_sequence(s, shape, 3, 50);
  for (const std::size_t w : {1u, 3u}) {
    CAPTURE(w);
    const json doc = bench_json(s, q.files + "--seed 3 --workers " + std::to_string(w) +
                                       " --method topk --ratio 0.05 --method topk --ratio 0.02 --error-feedback none"
                                       " --method topk --ratio 0.05 --approximate"
                                       " --method topk --ratio 0.05 --exchange leader");
    CHECK(doc["config"]["steps"] == 3);
    CHECK(doc["methods"][0]["params"] == json{{"ratio", 0.05},
                                              {"mode", "exact"},
                                              {"error_feedback", "residual"},
                                              {"exchange", "gather"},
                                              {"owner_memory", "on"}});
    CHECK(doc["methods"][3]["params"]["exchange"] == "leader");
    CHECK(doc["methods"][0]["kept"] == 50.0);
    check_method<bellows::topk<>>(doc["methods"][0], q, shape, w, 3, {.ratio = 0.05, .seed = 3});
    check_method<bellows::topk<>>(doc["methods"][1], q, shape, w, 3,
                                  {.ratio = 0.02, .feedback = bellows::feedback::none, .seed = 3});
    check_method<bellows::topk<>>(doc["methods"][2], q, shape, w, 3,
                                  {.ratio = 0.05, .mode = bellows::topk_mode::approximate, .seed = 3});
    check_method<bellows::topk<>>(doc["methods"][3], q, shape, w, 3,
                                  {.ratio = 0.05, .seed = 3, .exchange = bellows::exchange::leader});
  }
}

TEST_CASE("cli: --own-gradients gives each worker its own input and measures against their mean") {
  scratch s;
  const bellows::shape shape{30, 20};
  constexpr std::size_t workers = 2, steps = 3;
  const sequence q = write_sequence(s, shape, workers * steps, 70);
  const json doc = bench_json(s, q.files + "--workers 2 --own-gradients --method identity"
                                           " --method topk --ratio 0.1 --exchange leader --method topk --ratio 0.1");
  CHECK(doc["config"]["own_gradients"] == true);
  CHECK(doc["config"]["steps"] == steps);
  // identity's average is the mean itself: the same float sums in worker order, then / W
  for (const double e : doc["methods"][0]["rel_error_per_step"].get<std::vector<double>>()) CHECK(e == 0.0);
  // the leader's, brute force: worker w holds input t W + w; the error against the workers' mean
  std::vector<double> want;
  bellows::collectives::local_group(workers).run([&](bellows::collectives::local& comm) {
    bellows::topk<> c({.ratio = 0.1, .exchange = bellows::exchange::leader});
    auto st = c.make_state({0, "g", shape});
    for (std::size_t t = 0; t < steps; ++t) {
      std::vector<float> buf = q.grads[t * workers + comm.rank()];
      (void)c.reduce(st, buf, comm);
      if (comm.rank() != 0) continue;
      double diff = 0, norm = 0;
      for (std::size_t i = 0; i < buf.size(); ++i) {
        const double mean = (double{q.grads[t * workers][i]} + q.grads[t * workers + 1][i]) / 2;
        diff += (mean - buf[i]) * (mean - buf[i]);
        norm += mean * mean;
      }
      want.push_back(std::sqrt(diff / norm));
    }
  });
  const auto got = doc["methods"][1]["rel_error_per_step"].get<std::vector<double>>();
  REQUIRE(got.size() == want.size());
  for (std::size_t t = 0; t < got.size(); ++t) CHECK(got[t] == doctest::Approx(want[t]).epsilon(1e-6));
  CHECK(doc["methods"][2]["rel_error"].get<double>() != doc["methods"][1]["rel_error"].get<double>());

  const outcome few = bench(s, q.files + "--workers 8 --own-gradients --method identity");
  CHECK(few.code == 2);
  CHECK(few.err.find("8 workers need 8 input gradients per step, got 6") != std::string::npos);
}

TEST_CASE("cli: randk round trip against the library: shared, per-rank, unbiased") {
  scratch s;
  const bellows::shape shape{1000};
  const sequence q = write_sequence(s, shape, 1, 60);
  for (const std::size_t w : {1u, 3u}) {
    CAPTURE(w);
    const json doc = bench_json(s, q.files + "--steps 2 --seed 8 --workers " + std::to_string(w) +
                                       " --method randk --ratio 0.1 --method randk --ratio 0.1 --per-rank"
                                       " --method randk --ratio 0.1 --unbiased");
    CHECK(doc["methods"][2]["params"] == json{{"ratio", 0.1},
                                              {"mode", "shared"},
                                              {"unbiased", true},
                                              {"error_feedback", "none"},
                                              {"exchange", "gather"},
                                              {"owner_memory", "off"}});
    check_method<bellows::randk<>>(doc["methods"][0], q, shape, w, 2, {.ratio = 0.1, .seed = 8});
    check_method<bellows::randk<>>(doc["methods"][1], q, shape, w, 2,
                                   {.ratio = 0.1, .mode = bellows::randk_mode::per_rank, .seed = 8});
    check_method<bellows::randk<>>(doc["methods"][2], q, shape, w, 2,
                                   {.ratio = 0.1, .unbiased = true, .feedback = bellows::feedback::none, .seed = 8});
  }
}
