// SPDX-License-Identifier: Apache-2.0
// bellows-bench: what each compressor costs and how much it distorts a user's own gradients.
//
//   bellows-bench grad.npy --method topk --ratio 0.01 --method powersgd --rank 2 --steps 10
//   bellows-bench --model resnet50 --workers 64 --link 30,1.25 --method powersgd --rank 4
//
// Exit codes: 0 success, 1 another failure (writing --out, an internal error), 2 a usage error
// (printed with the usage line), 3 an input file that cannot be used.
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <unistd.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <iostream>
#include <string_view>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#if defined(BELLOWS_BENCH_CUDA)
#include "bellows-bench/device.hpp"
#endif
#include "bellows-bench/input.hpp"
#include "bellows-bench/measure.hpp"
#include "bellows-bench/methods.hpp"
#include "bellows-bench/model.hpp"
#include "bellows-bench/npy.hpp"
#include "bellows-bench/progress.hpp"
#include "bellows-bench/report.hpp"
#include "bellows-bench/synthetic.hpp"
#include "bellows/core/error.hpp"
#include "bellows/cpu/executor.hpp"

namespace {

using namespace bellows::tool;

constexpr int exit_failure = 1;
constexpr int exit_usage = 2;
constexpr int exit_bad_input = 3;

constexpr const char* usage_line =
    "usage: bellows-bench (FILE.npy... | --synthetic DIST --shape AxB... | --model NAME|FILE.json)\n"
    "                     --method NAME [its options] [--method NAME [its options]]... [options]";

/// A command line that cannot be run; main prints it with the usage line and exits 2.
class usage_error : public std::runtime_error {
public:
  using std::runtime_error::runtime_error;
};

struct method_group {
  const method* m = nullptr;
  method_args args;
};

struct options {
  std::vector<std::string> files;
  std::string synthetic;
  std::string shape;
  std::uint64_t seed = 0;
  std::string feedback;
  std::size_t steps = 0;  // 0: one step per input gradient
  std::size_t workers = 1;
  bool own_gradients = false;
  std::size_t repeats = 5;
  std::string backend = "cpu";
  unsigned threads = 0;
  bool json = false;
  std::string out;
  std::string model;
  std::string link = "30,1.25";
  double bucket_mb = 25;
  std::vector<method_group> groups;
};

/// CLI11's help with our usage line (its own cannot show the --method groups).
class help_formatter : public CLI::Formatter {
public:
  std::string make_usage(const CLI::App*, std::string) const override { return std::string(usage_line) + "\n"; }
};

/// The methods and their options, for the end of --help.
std::string methods_help() {
  std::string s = "Methods (each --method NAME is followed by that method's options):\n";
  for (const method& m : methods()) {
    s += "  " + std::string(m.name) + std::string(10 - std::min<std::size_t>(m.name.size(), 9), ' ') +
         std::string(m.summary) + "\n";
    CLI::App sub;
    sub.set_help_flag();
    method_args defaults;
    m.add_options(sub, defaults);
    for (const CLI::Option* o : sub.get_options()) {
      constexpr std::size_t column = 30;
      std::string line = "      " + o->get_name() + " " + o->get_type_name();
      line += line.size() < column ? std::string(column - line.size(), ' ') : "\n" + std::string(column, ' ');
      line += o->get_description();
      if (!o->get_default_str().empty()) line += " (default " + o->get_default_str() + ")";
      s += line + "\n";
    }
  }
  return s + "\nEvery rank holds the same gradient, so the exact average is the input itself and all the error\n"
             "is the compressor's. Exit codes: 0 done, 1 other failure, 2 usage error, 3 unusable input file.\n"
             "`bellows-bench --list-methods` prints the methods' names, one per line.\n";
}

void add_global_options(CLI::App& app, options& o) {
  app.add_option("files", o.files,
                 ".npy files (float32 or float16, C order, any shape; the first axis is the rows of "
                 "PowerSGD's matrix). Several files are a sequence: step t uses file t mod count");
  app.add_option("--synthetic", o.synthetic, "a synthetic gradient instead of files")
      ->check(CLI::IsMember({"normal", "laplace", "lognormal"}));
  app.add_option("--shape", o.shape, "shape of the synthetic gradient, e.g. 4096x4096");
  app.add_option("--seed", o.seed, "seed of the synthetic gradient and of the methods' random choices")
      ->capture_default_str();
  app.add_option("--error-feedback", o.feedback,
                 "memory of what compression left out, for every method that has none of its own "
                 "--error-feedback (default: each method's own, see below)")
      ->check(CLI::IsMember({"residual", "none"}));
  app.add_option("--steps", o.steps,
                 "reduce calls whose traffic and error are measured, replaying the input gradients in "
                 "order through the error memory (default: one per input gradient)")
      ->check(CLI::Range(std::size_t{1}, std::size_t{1000000}));
  app.add_option("--workers", o.workers,
                 "simulated ranks: threads of one process exchanging through bellows' local "
                 "collective. Every rank holds the same gradient (the input at that step); bytes are "
                 "one rank's")
      ->check(CLI::Range(std::size_t{1}, std::size_t{1024}))
      ->capture_default_str();
  app.add_flag("--own-gradients", o.own_gradients,
               "each worker holds its own gradient: at step t worker w replays input t W + w (give W inputs "
               "per step), and the error is measured against the workers' exact mean");
  app.add_option("--repeats", o.repeats,
                 "at least this many timed calls per method after one warm-up call; the time is their median")
      ->check(CLI::Range(std::size_t{1}, std::size_t{1000000}))
      ->capture_default_str();
  app.add_option("--backend", o.backend, "where the compressors run")
      ->check(CLI::IsMember({"cpu", "cuda"}))
      ->capture_default_str();
  app.add_option("--threads", o.threads, "CPU threads of the compressors' kernels (0: all cores)")
      ->capture_default_str();
  app.add_flag("--json", o.json, "print JSON instead of the table");
  app.add_option("--model", o.model,
                 "model a whole model's step instead of measuring a gradient: resnet50, bert-base, or a "
                 "JSON file {\"layers\": [{\"name\": ..., \"shape\": [...]}, ...]}; reports collective calls, "
                 "bytes and modeled time per rank, layer by layer and in buckets, beside DDP's allreduce");
  app.add_option("--link", o.link, "with --model: LATENCY_US,BANDWIDTH_GBPS of the alpha-beta link")
      ->capture_default_str();
  app.add_option("--bucket-mb", o.bucket_mb,
                 "with --model: the buckets' budget in MiB of gradient (DDP's bucket_cap_mb)")
      ->check(CLI::Range(0.0, 1e6))
      ->capture_default_str();
  app.add_option("--out", o.out,
                 "write the averaged result of the last step as a float32 .npy file; with several "
                 "methods, FILE.npy becomes FILE.<position>.<method>.npy");
}

/// The global parser: options, help with the methods, version.
void configure(CLI::App& app, options& o) {
  app.formatter(std::make_shared<help_formatter>());
  app.footer(methods_help());
  app.set_version_flag("--version", BELLOWS_VERSION);
  add_global_options(app, o);
}

/// Splits the command line into global arguments and `--method NAME ...` groups, parses each
/// group's own options, and hands what a group does not know back to the global parser. Returns
/// nothing when it printed --help, --version or --list-methods.
std::optional<options> parse(int argc, char** argv) {
  if (argc == 2 && std::string_view(argv[1]) == "--list-methods") {  // for scripts: the names, one per line
    for (const method& m : methods()) std::cout << m.name << '\n';
    return std::nullopt;
  }
  options o;
  std::vector<std::string> global;
  std::vector<std::vector<std::string>> group_args;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    std::string name;
    if (a == "--method") {
      if (i + 1 == argc)
        throw usage_error("--method needs a NAME: " + bellows::method_names(bellows::compressor_methods{}));
      name = argv[++i];
    } else if (a.rfind("--method=", 0) == 0) {
      name = a.substr(9);
    } else {
      (group_args.empty() ? global : group_args.back()).push_back(a);
      continue;
    }
    const method* m = find_method(name);
    if (m == nullptr)
      throw usage_error("unknown method '" + name +
                        "'; methods: " + bellows::method_names(bellows::compressor_methods{}));
    o.groups.push_back({m, {}});
    group_args.emplace_back();
  }
  for (std::size_t g = 0; g < o.groups.size(); ++g) {
    const std::string name(o.groups[g].m->name);
    CLI::App sub{"", name};
    sub.set_help_flag();
    sub.allow_extras();
    o.groups[g].m->add_options(sub, o.groups[g].args);
    std::vector<std::string> reversed(group_args[g].rbegin(), group_args[g].rend());
    try {
      sub.parse(reversed);
    } catch (const CLI::ParseError& e) {
      throw usage_error("--method " + name + ": " + e.what());
    }
    for (const std::string& extra : sub.remaining()) global.push_back(extra);
  }
  CLI::App app{"Measures gradient compressors on your own gradients: bytes sent, error, time.", "bellows-bench"};
  configure(app, o);
  std::vector<std::string> reversed(global.rbegin(), global.rend());
  try {
    app.parse(reversed);
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() != 0) throw usage_error(e.what());
    (void)app.exit(e);  // prints --help or --version
    return std::nullopt;
  }
  return o;
}

/// Checks what CLI11 cannot: combinations of options.
void check_combinations(const options& o) {
#if defined(BELLOWS_BENCH_CUDA)
  if (o.backend == "cuda" && o.workers != 1)
    throw usage_error("--backend cuda measures one rank: give --workers 1 (the device has no simulated ranks)");
#else
  if (o.backend == "cuda")
    throw usage_error("--backend cuda: not built with CUDA; this bellows-bench has the cpu backend only");
#endif
  if (o.groups.empty())
    throw usage_error("no method: give at least one --method NAME (" +
                      bellows::method_names(bellows::compressor_methods{}) + ")");
  if (o.files.empty() == o.synthetic.empty())
    throw usage_error(o.files.empty() ? "no input: give .npy files or --synthetic DIST --shape AxB"
                                      : "give either .npy files or --synthetic, not both");
  if (!o.synthetic.empty() && o.shape.empty()) throw usage_error("--synthetic needs --shape, e.g. 4096x4096");
  if (o.synthetic.empty() && !o.shape.empty()) throw usage_error("--shape goes with --synthetic");
  if (!o.out.empty()) {  // checked now, not after a long run
    const std::filesystem::path dir = std::filesystem::path(o.out).parent_path();
    const std::string where = dir.empty() ? "." : dir.string();
    if (!std::filesystem::is_directory(where) || ::access(where.c_str(), W_OK) != 0)
      throw usage_error("--out " + o.out + ": " + where + " is not a directory this process can write to");
  }
}

gradient_set load_input(const options& o, bellows::cpu::executor& exec) {
  if (!o.files.empty()) return load_files(o.files, exec);
  bellows::shape shape;
  try {
    shape = parse_shape(o.shape);
  } catch (const std::invalid_argument& e) {
    throw usage_error(e.what());
  }
  const distribution d = o.synthetic == "laplace"     ? distribution::laplace
                         : o.synthetic == "lognormal" ? distribution::lognormal
                                                      : distribution::normal;
  gradient_set set;
  set.add("synthetic " + o.synthetic + " (seed " + std::to_string(o.seed) + ")", "float32", shape,
          synthetic_gradient(d, shape.size(), o.seed, exec), exec);
  return set;
}

std::string out_path(const options& o, std::size_t position) {
  if (o.groups.size() == 1) return o.out;
  const std::filesystem::path p(o.out);
  return (p.parent_path() / (p.stem().string() + "." + std::to_string(position + 1) + "." +
                             std::string(o.groups[position].m->name) + p.extension().string()))
      .string();
}

/// --model: the modeled step of every method, layer by layer and in buckets, and DDP's.
int run_model(options& o) {
  if (o.groups.empty())
    throw usage_error("no method: give at least one --method NAME (" +
                      bellows::method_names(bellows::compressor_methods{}) + ")");
  if (!o.files.empty() || !o.synthetic.empty() || !o.out.empty() || o.backend != "cpu")
    throw usage_error("--model models a whole step from the layers' shapes: give no .npy files, --synthetic, "
                      "--out or --backend");
  bellows::collectives::alpha_beta link;
  try {
    link = parse_link(o.link);
  } catch (const std::invalid_argument& e) {
    throw usage_error(e.what());
  }
  const std::vector<bellows::layer_info> layers = load_model(o.model);
  const auto budget = static_cast<std::size_t>(o.bucket_mb * 1024 * 1024);
  const std::vector<std::uint32_t> bounds = bellows::plan_buckets(layers, budget);
  model_report report{o.model, layers, bounds.size() - 1, budget, link, o.workers, ddp(layers, bounds, o.workers, link),
                      {}};
  for (method_group& g : o.groups) {
    g.args.seed = o.seed;
    if (g.args.feedback.empty()) g.args.feedback = o.feedback;
    std::vector<bellows::exchange_rounds> rounds;
    try {
      rounds = g.m->rounds(g.args, layers, o.workers);
    } catch (const bellows::error& e) {
      throw usage_error("--method " + std::string(g.m->name) + ": " + e.what());
    }
    report.methods.push_back({std::string(g.m->name), g.m->params(g.args), per_layer(rounds, o.workers, link),
                              per_bucket(rounds, bounds, o.workers, link)});
  }
  if (o.json)
    std::cout << to_json(report).dump(2) << '\n';
  else
    print_table(std::cout, report);
  return 0;
}

int run(int argc, char** argv) {
  std::optional<options> parsed = parse(argc, argv);
  if (!parsed) return 0;
  options& o = *parsed;
  if (!o.model.empty()) return run_model(o);
  check_combinations(o);
#if defined(BELLOWS_BENCH_CUDA)
  if (o.backend == "cuda" && !device_present()) {
    std::cerr << "bellows-bench: --backend cuda: no CUDA device\n";
    return exit_failure;
  }
#endif
  bellows::cpu::executor exec(o.threads);
  const gradient_set input = load_input(o, exec);

  const std::string layer_name = o.files.empty() ? "synthetic" : std::filesystem::path(o.files.front()).stem().string();
  const bellows::layer_info layer{0, layer_name, input.shape};
  for (method_group& g : o.groups) {
    g.args.seed = o.seed;
    if (g.args.feedback.empty()) g.args.feedback = o.feedback;
    try {
      g.m->check(g.args, layer, exec);
#if defined(BELLOWS_BENCH_CUDA)
      if (o.backend == "cuda") check_on_device(g.m->name, g.args.settings(), layer);
#endif
    } catch (const bellows::error& e) {
      throw usage_error("--method " + std::string(g.m->name) + ": " + e.what());
    }
  }

  run_report report;
  report.input = &input;
  const std::size_t per_step = o.own_gradients ? o.workers : 1;
  if (input.size() < per_step)
    throw usage_error("--own-gradients: " + std::to_string(o.workers) + " workers need " + std::to_string(per_step) +
                      " input gradients per step, got " + std::to_string(input.size()));
  report.settings = {o.steps == 0 ? input.size() / per_step : o.steps, o.workers, o.repeats, !o.out.empty(),
                     o.own_gradients};
  report.backend = o.backend;
  report.threads = exec.threads();
  report.seed = o.seed;
  progress bar(std::cerr, ::isatty(STDERR_FILENO) == 1, o.groups.size() * calls_per_method(report.settings));
  for (const method_group& g : o.groups) {
    bar.label(std::string(g.m->name));
    const run_request req{input, layer, report.settings, exec, bar};
#if defined(BELLOWS_BENCH_CUDA)
    method_result result =
        o.backend == "cuda" ? measure_on_device(g.m->name, g.args.settings(), req) : g.m->run(g.args, req);
#else
    method_result result = g.m->run(g.args, req);
#endif
    report.methods.push_back({std::string(g.m->name), g.m->params(g.args), std::move(result), {}});
  }
  bar.finish();

  if (!o.out.empty()) {
    for (std::size_t i = 0; i < report.methods.size(); ++i) {
      method_report& m = report.methods[i];
      m.out_path = out_path(o, i);
      try {
        npy::write(m.out_path, input.shape, m.result.output);
      } catch (const bellows::error& e) {
        std::cerr << "bellows-bench: --out " << m.out_path << ": " << e.what() << '\n';
        return exit_failure;
      }
    }
  }
  if (o.json)
    std::cout << to_json(report).dump(2) << '\n';
  else
    print_table(std::cout, report);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const usage_error& e) {
    std::cerr << "bellows-bench: " << e.what() << '\n' << usage_line << "\nRun with --help for more.\n";
    return exit_usage;
  } catch (const npy::format_error& e) {
    std::cerr << "bellows-bench: " << e.what() << '\n';
    return exit_bad_input;
  } catch (const input_error& e) {
    std::cerr << "bellows-bench: " << e.what() << '\n';
    return exit_bad_input;
  } catch (const std::exception& e) {
    std::cerr << "bellows-bench: " << e.what() << '\n';
    return exit_failure;
  }
}
