// The one-way include rule of lib/dtrain (scripts/check-layout.sh): it holds for this tree, and
// the check catches a wrong-way include planted in a copy of it.
#include <catch2/catch.hpp>

#include <filesystem>
#include <fstream>

#include "helpers.hpp"

namespace fs = std::filesystem;
using namespace dtrain;
using namespace dtrain::test;

namespace {
std::string check_layout(const fs::path& lib) {
  const std::string script = (fs::path(source_dir()) / "scripts" / "check-layout.sh").string();
  const ShellResult r = shell("bash '" + script + "' '" + lib.string() + "' 2>&1");
  return std::to_string(r.code) + "\n" + r.out;
}
void append_line(const fs::path& file, const std::string& line) {
  std::ofstream(file, std::ios::app) << line << "\n";
}
}  // namespace

TEST_CASE("every include in lib/dtrain points down the layers", "[layout]") {
  const std::string out = check_layout(fs::path(source_dir()) / "lib" / "dtrain");
  INFO(out);
  CHECK(out.rfind("0\n", 0) == 0);
  CHECK(out.find("points down the layers") != std::string::npos);
}

TEST_CASE("the layout check fails on a planted wrong-way include", "[layout]") {
  TempDir tmp;
  const fs::path lib = tmp.path / "dtrain";
  fs::copy(fs::path(source_dir()) / "lib" / "dtrain", lib, fs::copy_options::recursive);
  SECTION("a lower layer includes a higher one") {
    append_line(lib / "base" / "error.hpp", "#include \"dtrain/train/trainer.hpp\"");
    const std::string out = check_layout(lib);
    INFO(out);
    CHECK(out.rfind("1\n", 0) == 0);
    CHECK(out.find("base/error.hpp:") != std::string::npos);
    CHECK(out.find("base may not include dtrain/train/trainer.hpp") != std::string::npos);
  }
  SECTION("the backend layer includes the config") {
    append_line(lib / "backend" / "device.hpp", "#include \"dtrain/config/config.hpp\"");
    const std::string out = check_layout(lib);
    INFO(out);
    CHECK(out.rfind("1\n", 0) == 0);
    CHECK(out.find("backend may not include dtrain/config/config.hpp") != std::string::npos);
  }
  SECTION("one backend includes the other") {
    append_line(lib / "backend" / "cpu" / "cpu_device.cpp",
                "#  include \"dtrain/backend/cuda/cuda_device.cu\"");
    const std::string out = check_layout(lib);
    INFO(out);
    CHECK(out.rfind("1\n", 0) == 0);
    CHECK(out.find("only backend/cuda/ may include") != std::string::npos);
  }
  SECTION("a file outside the layers") {
    append_line(lib / "stray.hpp", "#pragma once");
    const std::string out = check_layout(lib);
    INFO(out);
    CHECK(out.rfind("1\n", 0) == 0);
    CHECK(out.find("stray.hpp: outside the layers") != std::string::npos);
  }
}
