// dtrain bench-comm: sizes, timing and checking over in-process replicas, the fit, the planted
// wrong result, and the CLI (and under mpirun where there is one).
#include <catch2/catch.hpp>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <thread>

#include "dtrain/base/error.hpp"
#include "dtrain/comm/bench_comm.hpp"
#include "dtrain/comm/comm.hpp"
#include "helpers.hpp"

namespace fs = std::filesystem;
using namespace dtrain;
using namespace dtrain::test;

namespace {

std::vector<SizeResult> run_group(int n, const BenchSettings& s) {
  InProcessGroup group(n);
  std::vector<std::vector<SizeResult>> out(static_cast<size_t>(n));
  std::vector<std::thread> ts;
  for (int r = 0; r < n; ++r)
    ts.emplace_back([&, r] {
      auto comm = group.communicator(r);
      out[static_cast<size_t>(r)] = bench_allreduce(*comm, s);
    });
  for (auto& t : ts) t.join();
  for (int r = 1; r < n; ++r) {  // every rank reports the same numbers
    REQUIRE(out[static_cast<size_t>(r)].size() == out[0].size());
    for (size_t i = 0; i < out[0].size(); ++i) {
      CHECK(out[static_cast<size_t>(r)][i].time_s == out[0][i].time_s);
      CHECK(out[static_cast<size_t>(r)][i].wrong == out[0][i].wrong);
    }
  }
  return out[0];
}

}  // namespace

TEST_CASE("bench-comm sizes double from MIN to MAX, with K, M and G suffixes", "[bench-comm]") {
  CHECK(parse_sizes("4K:32K") == std::vector<size_t>{4096, 8192, 16384, 32768});
  CHECK(parse_sizes("1m") == std::vector<size_t>{1 << 20});
  CHECK(parse_sizes("8:40") == std::vector<size_t>{8, 16, 32});
  CHECK(parse_sizes("1G:1G") == std::vector<size_t>{size_t{1} << 30});
  for (const char* bad : {"", ":", "abc", "4K:1K", "3", "6:12", "4X", "0", "-4K", "4K:", ":4K",
                          "4KB", "4K:8K:16K", "99999999999G", " 4K"})
    CHECK_THROWS_AS(parse_sizes(bad), UserError);
}

TEST_CASE("in-process all-reduce: no wrong element, busbw = algbw * 2(n-1)/n", "[bench-comm]") {
  BenchSettings s;
  s.sizes = parse_sizes("4:64K");
  s.iters = 3;
  s.warmup = 1;
  for (int n : {2, 3, 4}) {
    const auto rows = run_group(n, s);
    REQUIRE(rows.size() == s.sizes.size());
    for (const auto& r : rows) {
      CHECK(r.wrong == 0);
      CHECK(r.count * 4 == r.bytes);
      CHECK(r.time_s > 0);
      CHECK(r.algbw == Approx(static_cast<double>(r.bytes) / r.time_s));
      CHECK(r.busbw == Approx(r.algbw * 2.0 * (n - 1) / n));
    }
  }
}

TEST_CASE("a planted wrong element is counted", "[bench-comm]") {
  BenchSettings s;
  s.sizes = {4096, 8192};
  s.iters = 2;
  s.warmup = 0;
  s.corrupt_rank = 1;
  for (const auto& r : run_group(3, s)) CHECK(r.wrong == 1);
}

TEST_CASE("the fit recovers a + b * bytes and reads it through the ring model", "[bench-comm]") {
  const double a = 20e-6, b = 1e-9;  // 20 us, 1 GB/s
  std::vector<SizeResult> rows;
  for (size_t bytes = 4096; bytes <= (size_t{1} << 26); bytes *= 2) {
    SizeResult r;
    r.bytes = bytes;
    r.time_s = a + b * static_cast<double>(bytes);
    rows.push_back(r);
  }
  const LinkFit f = fit_link(rows, 4);
  CHECK(f.a_s == Approx(a));
  CHECK(f.b_s_per_byte == Approx(b));
  CHECK(f.alpha_s == Approx(a / 6));              // 2(n-1) = 6 ring steps
  CHECK(f.busbw == Approx(1.0 / (b * 4 / 6.0)));  // 1 / (b n / 2(n-1))
  CHECK(std::isnan(fit_link({rows[0]}, 4).busbw));
}

TEST_CASE("one row function: the text, Markdown and JSON rows agree", "[bench-comm]") {
  BenchReport rep;
  rep.communicator = "in-process";
  rep.ranks = 2;
  SizeResult r;
  r.bytes = 8192;
  r.count = 2048;
  r.time_s = 12.5e-6;
  r.algbw = 8192 / 12.5e-6;
  r.busbw = r.algbw;
  r.wrong = 3;
  rep.rows = {r};
  const auto j = nlohmann::json::parse(to_json(rep));
  const auto& row = j["rows"][0];
  CHECK(row["size_bytes"] == 8192);
  CHECK(row["count"] == 2048);
  CHECK(row["type"] == "float");
  CHECK(row["time_us"].get<double>() == Approx(12.5));
  CHECK(row["algbw_GBps"].get<double>() == Approx(0.65536));
  CHECK(row["wrong"] == 3);
  CHECK(j["wrong"] == 3);
  CHECK(
      to_text(rep).find("        8192         2048  float      12.50     0.66     0.66       3") !=
      std::string::npos);
  CHECK(to_markdown(rep).find("| 8192 | 2048 | float | 12.50 | 0.66 | 0.66 | 3 |") !=
        std::string::npos);
}

TEST_CASE("dtrain bench-comm prints the table and writes JSON and Markdown", "[bench-comm][cli]") {
  TempDir t("bench-comm");
  for (int n : {2, 4}) {
    const fs::path out = t.path / ("b" + std::to_string(n));
    // Sizes where the time grows with the bytes even on a busy machine (at 4K to 32K the
    // in-process times are flat, and the fit once found no slope there), so the fit line shows.
    const auto r = dtrain_cli("bench-comm --replicas " + std::to_string(n) +
                              " --sizes 64K:4M --iters 5 --warmup 1 --out " + out.string());
    INFO(r.out);
    REQUIRE(r.code == 0);
    CHECK(r.out.find("#wrong") != std::string::npos);
    CHECK(r.out.find("busbw_fit") != std::string::npos);
    const auto j = nlohmann::json::parse(slurp(out.string() + ".json"));
    CHECK(j["ranks"] == n);
    CHECK(j["wrong"] == 0);
    REQUIRE(j["rows"].size() == 7);
    for (const auto& row : j["rows"]) {
      const double algbw = row["algbw_GBps"].get<double>();
      CHECK(algbw == Approx(row["size_bytes"].get<double>() / row["time_us"].get<double>() / 1e3));
      CHECK(row["busbw_GBps"].get<double>() == Approx(algbw * 2.0 * (n - 1) / n));
    }
    CHECK(fs::exists(out.string() + ".md"));
  }
}

TEST_CASE("dtrain bench-comm: a planted wrong result exits 1, bad input exits 2",
          "[bench-comm][cli]") {
  TempDir t("bench-comm-bad");
  const std::string out = (t.path / "w").string();
  const auto w = shell("DTRAIN_BENCH_COMM_CORRUPT=1 " + dtrain_binary() +
                       " bench-comm --replicas 2 --sizes 4K:8K --iters 2 --warmup 0 --out " + out);
  INFO(w.out);
  CHECK(w.code == 1);
  CHECK(w.out.find("2 wrong elements") != std::string::npos);
  CHECK(nlohmann::json::parse(slurp(out + ".json"))["wrong"] == 2);

  for (const char* args :
       {"--sizes 4K:1K", "--sizes lots", "--sizes 6", "--replicas 1", "--iters 0"}) {
    const auto r = dtrain_cli(std::string("bench-comm ") + args + " --out " + out + "-bad");
    INFO(args << ": " << r.out);
    CHECK(r.code == 2);
    CHECK(count_lines(r.out) == 1);
    CHECK(r.out.rfind("dtrain: error: ", 0) == 0);
  }
  // A measurement is never written over, and --out names a file, not a folder.
  const std::string before = slurp(out + ".json");
  const auto again = dtrain_cli("bench-comm --replicas 2 --sizes 4K:8K --out " + out);
  CHECK(again.code == 2);
  CHECK_THAT(again.out, Catch::Contains("w.md exists; a measurement is never written over"));
  CHECK(slurp(out + ".json") == before);
  for (const std::string& folder : {t.path.string() + "/", std::string("/"), std::string(".")}) {
    const auto f = dtrain_cli("bench-comm --replicas 2 --sizes 4K:8K --out " + folder);
    INFO(folder << ": " << f.out);
    CHECK(f.code == 2);
    CHECK_THAT(f.out, Catch::Contains("a folder, not a file name"));
  }
  const auto env = shell("DTRAIN_BENCH_COMM_CORRUPT=x " + dtrain_binary() + " bench-comm");
  CHECK(env.code == 2);
}

TEST_CASE("dtrain bench-comm under mpirun times MPI", "[bench-comm][mpi]") {
  if (const auto why = mpirun_missing(); !why.empty()) {
    WARN("SKIPPED: " << why);
    return;
  }
  TempDir t("bench-comm-mpi");
  const std::string out = (t.path / "m").string();
  const auto r =
      shell(mpirun(2) + dtrain_binary() + " bench-comm --sizes 4K:16K --iters 2 --out " + out);
  INFO(r.out);
  REQUIRE(r.code == 0);
  const auto j = nlohmann::json::parse(slurp(out + ".json"));
  CHECK(j["communicator"] == "mpi");
  CHECK(j["ranks"] == 2);
  CHECK(j["wrong"] == 0);
  // Each process is one replica: another --replicas is refused, not ignored; the process count
  // itself is accepted.
  const auto other = shell(mpirun(2) + dtrain_binary() +
                           " bench-comm --sizes 4K:16K --iters 2 --replicas 4 --out " + out + "4");
  INFO(other.out);
  CHECK(other.code == 2);
  CHECK_THAT(other.out, Catch::Contains("--replicas 4: under mpirun or srun each of the 2 "
                                        "processes is one replica"));
  CHECK_FALSE(fs::exists(out + "4.json"));
  CHECK(shell(mpirun(2) + dtrain_binary() + " bench-comm --sizes 4K:16K --iters 2 --replicas 2 " +
              "--out " + out + "2")
            .code == 0);
}
