#pragma once
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <initializer_list>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "dtrain/base/error.hpp"
#include "dtrain/base/rng.hpp"
#include "dtrain/config/config.hpp"
#include "dtrain/data/data.hpp"
#include "dtrain/train/trainer.hpp"

// Built with AddressSanitizer (GCC or clang): peak memory is then the sanitizer's, not dtrain's.
#if defined(__SANITIZE_ADDRESS__)
#define DTRAIN_TEST_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define DTRAIN_TEST_ASAN 1
#endif
#endif

namespace dtrain::test {

// Uniform random values in [lo, hi).
inline std::vector<float> random_vec(Rng& rng, size_t n, double lo = -1, double hi = 1) {
  std::vector<float> v(n);
  for (auto& x : v) x = static_cast<float>(rng.uniform(lo, hi));
  return v;
}

// max |a - b| / max |b|: the error of `a` relative to the scale of the tensor `b`.
inline double rel_error(const std::vector<float>& a, const std::vector<float>& b) {
  double num = 0, den = 1e-30;
  for (size_t i = 0; i < a.size(); ++i) {
    num = std::max(num, std::abs(double(a[i]) - b[i]));
    den = std::max(den, std::abs(double(b[i])));
  }
  return num / den;
}

// A small synthetic experiment that trains in well under a second.
inline Config synthetic_config(int gpus, int64_t per_replica_batch) {
  Config c;
  c.name = "test";
  c.backend = Backend::cpu;  // never `auto`: on a GPU machine it would pick CUDA for 1 replica
  c.gpus = gpus;
  c.threads = 1;
  c.data.dataset = DatasetKind::synthetic;
  c.data.synthetic.train_size = 128 * 60;
  c.data.synthetic.test_size = 512;
  c.data.synthetic.shape = {16};
  c.data.synthetic.classes = 4;
  c.data.synthetic.noise = 2.0;
  c.model.hidden = {32, 16};
  c.train.epochs = 1;
  c.train.per_replica_batch = per_replica_batch;
  c.train.target_accuracy = 0;
  c.optimizer.lr = 0.05;
  c.optimizer.base_batch = 128;
  c.optimizer.momentum = 0.9;
  c.optimizer.weight_decay = 0.0;
  c.optimizer.lr_scaling = LrScaling::none;
  return c;
}

// A small conv net on 2x6x6 synthetic images (conv to 4 channels, BatchNorm, ReLU, dense 24,
// ReLU, dropout 0.3) with flips drawn from each replica's stream and no sample dropped: what
// has state beyond the weights.
inline Config small_image_config(int gpus, int64_t per_replica_batch, int64_t train_size) {
  Config c = synthetic_config(gpus, per_replica_batch);
  c.data.synthetic.train_size = train_size;
  c.data.drop_remainder = false;
  c.data.synthetic.shape = {2, 6, 6};
  c.data.augment.flip = true;
  c.model.type = ModelType::layers;
  for (LayerType t : {LayerType::conv, LayerType::batchnorm, LayerType::relu, LayerType::flatten,
                      LayerType::dense, LayerType::relu, LayerType::dropout}) {
    LayerSpec l;
    l.type = t;
    c.model.layers.push_back(l);
  }
  c.model.layers[0].channels = 4;
  c.model.layers[0].padding = 1;
  c.model.layers[4].units = 24;
  c.model.layers[6].p = 0.3;
  return c;
}

// The UserError message of calling f, or "" when it throws none.
inline std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const UserError& e) {
    return e.what();
  }
  return "";
}

// A tiny synthetic experiment, as YAML, that dtrain runs in well under a second per run.
inline std::string tiny_config(const std::string& name_yaml) {
  return "name: " + name_yaml + R"(
threads: 1
data:
  dataset: synthetic
  synthetic: {train_size: 512, test_size: 128, shape: [8], classes: 3, noise: 1.0}
model: {hidden: [16]}
train: {epochs: 2, per_replica_batch: 16, target_accuracy: 0}
optimizer: {lr: 0.05, base_batch: 16}
)";
}

// Relative difference with a floor on the denominator.
inline double rel_diff(double a, double b) {
  const double d = std::abs(a - b);
  const double s = std::max({std::abs(a), std::abs(b), 1e-12});
  return d / s;
}

// The UserError message of parsing `yaml` (as file "exp.yaml") with overrides, or "".
inline std::string config_error(const std::string& yaml, const std::vector<Override>& ov = {},
                                const std::string& file = "exp.yaml") {
  try {
    parse_config(yaml, file, ov);
  } catch (const UserError& e) {
    return e.what();
  }
  return "";
}

// DTRAIN_REQUIRE_GPU=1: the GPU tests fail instead of skipping where there is no GPU.
inline bool gpu_required() {
  const char* v = std::getenv("DTRAIN_REQUIRE_GPU");
  return v && std::string(v) == "1";
}

// Trains `c` on its configured data.
inline TrainResult run_config(const Config& c) {
  return train(c, load_data(c.data, c.train.seed), nullptr);
}

// Largest relative difference between the per-step losses of two runs of equal length.
inline double max_rel_step_diff(const TrainResult& a, const TrainResult& b) {
  if (a.step_losses.size() != b.step_losses.size())
    throw std::runtime_error("runs differ in step count");
  double worst = 0;
  for (size_t i = 0; i < a.step_losses.size(); ++i)
    worst = std::max(worst, rel_diff(a.step_losses[i], b.step_losses[i]));
  return worst;
}

// Path of the built dtrain binary and the source tree (set by CMake), and of Fashion-MNIST.
// Binaries carried to another machine (scripts/build-portable.sh) find them through
// DTRAIN_TEST_BINARY, DTRAIN_TEST_SOURCE_DIR and DTRAIN_TEST_DATA.
inline std::string env_or(const char* name, const char* fallback) {
  const char* v = std::getenv(name);
  return v && *v ? v : fallback;
}
inline std::string dtrain_binary() {
  return env_or("DTRAIN_TEST_BINARY", DTRAIN_BINARY);
}
inline std::string source_dir() {
  return env_or("DTRAIN_TEST_SOURCE_DIR", DTRAIN_SOURCE_DIR);
}
inline std::string fmnist_dir() {
  return env_or("DTRAIN_TEST_DATA", "/usr/share/datasets/fashion-mnist");
}

struct ShellResult {
  int code;         // exit code, -1 if killed by a signal
  std::string out;  // stdout and stderr together
};

// Runs `cmd` through /bin/sh and captures its output.
inline ShellResult shell(const std::string& cmd) {
  FILE* p = popen((cmd + " 2>&1").c_str(), "r");
  if (!p) throw std::runtime_error("popen failed: " + cmd);
  std::string out;
  char buf[4096];
  while (size_t n = fread(buf, 1, sizeof buf, p)) out.append(buf, n);
  const int status = pclose(p);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, out};
}

// One mpirun invocation as CI can run it: as root, more ranks than cores, shared memory only.
inline std::string mpirun(int np) {
  return "mpirun --allow-run-as-root --oversubscribe --mca btl self,vader "
         "--mca btl_vader_single_copy_mechanism none -np " +
         std::to_string(np) + " ";
}

// Why the tests that start dtrain under mpirun cannot run here, or "" when they can: they need
// a dtrain built with MPI (the portable build has none) and a working mpirun.
inline std::string mpirun_missing() {
#ifndef DTRAIN_HAVE_MPI
  return "this dtrain was built without MPI";
#else
  if (std::system("command -v mpirun > /dev/null 2>&1") != 0 ||
      std::system((mpirun(1) + "true > /dev/null 2>&1").c_str()) != 0)
    return "mpirun (openmpi-bin) is not available";
  return "";
#endif
}

// Runs dtrain with `args` (no shell) and returns its exit code and peak resident memory (MiB).
inline std::pair<int, double> dtrain_peak_mib(std::vector<std::string> args) {
  args.insert(args.begin(), dtrain_binary());
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  const pid_t pid = fork();
  if (pid == 0) {
    std::freopen("/dev/null", "w", stdout);
    execv(argv[0], argv.data());
    _exit(127);
  }
  int status = 0;
  rusage u{};
  while (wait4(pid, &status, 0, &u) < 0 && errno == EINTR) {
  }
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, static_cast<double>(u.ru_maxrss) / 1024};
}

// Runs the dtrain binary with `args`.
inline ShellResult dtrain_cli(const std::string& args) {
  return shell(dtrain_binary() + " " + args);
}

inline std::string slurp(const std::filesystem::path& p) {
  std::ifstream in(p);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// The metrics.csv columns that depend on arithmetic only (not on timing).
inline std::string numeric_columns(const std::filesystem::path& metrics) {
  std::stringstream in(slurp(metrics)), out;
  for (std::string line; std::getline(in, line);) {
    std::stringstream ls(line);
    std::string cell;
    for (int c = 0; c < 7 && std::getline(ls, cell, ','); ++c) out << cell << ',';
    out << '\n';
  }
  return out.str();
}

inline void put(const std::filesystem::path& p, const std::string& text) {
  std::filesystem::create_directories(p.parent_path());
  std::ofstream(p) << text;
}

inline int count_lines(const std::string& s) {
  return static_cast<int>(std::count(s.begin(), s.end(), '\n'));
}

// A fresh folder under the system temp folder, removed at the end of the scope.
struct TempDir {
  std::filesystem::path path;
  explicit TempDir(const std::string& name = "tmp") {
    static int counter = 0;
    path = std::filesystem::temp_directory_path() /
           ("dtrain-" + name + "-" + std::to_string(::getpid()) + "-" + std::to_string(counter++));
    std::filesystem::remove_all(path);
    std::filesystem::create_directories(path);
  }
  ~TempDir() { std::filesystem::remove_all(path); }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  std::string write(const std::string& name, const std::string& text) const {
    put(path / name, text);
    return (path / name).string();
  }
};

// Sets environment variables for one scope, restoring what was there; the launchers' variables
// (Open MPI, Slurm, PMI) are cleared first, so a test sees only the launch it sets up.
struct EnvScope {
  std::vector<std::pair<std::string, std::optional<std::string>>> saved;
  EnvScope(std::initializer_list<std::pair<const char*, const char*>> vars) {
    for (const char* v :
         {"OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_LOCAL_RANK",
          "OMPI_COMM_WORLD_LOCAL_SIZE", "SLURM_PROCID", "SLURM_STEP_ID", "SLURM_NTASKS",
          "SLURM_STEP_NUM_TASKS", "SLURM_LOCALID", "SLURM_NODEID", "SLURM_STEP_TASKS_PER_NODE",
          "SLURM_TASKS_PER_NODE", "PMIX_RANK", "PMI_SIZE", "PMI_RANK", "MPI_LOCALRANKID",
          "MPI_LOCALNRANKS"}) {
      const char* old = std::getenv(v);
      saved.emplace_back(v, old ? std::optional<std::string>(old) : std::nullopt);
      ::unsetenv(v);
    }
    for (const auto& [k, val] : vars) ::setenv(k, val, 1);
  }
  ~EnvScope() {
    for (const auto& [k, v] : saved)
      if (v)
        ::setenv(k.c_str(), v->c_str(), 1);
      else
        ::unsetenv(k.c_str());
  }
};

}  // namespace dtrain::test
