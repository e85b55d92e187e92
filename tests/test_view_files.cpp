// Opening files: the recent-files list and the directory listings of the file dialog.
#include <catch2/catch.hpp>

#include <cmath>
#include <fstream>
#include <random>
#include <nlohmann/json.hpp>

#include "app/model/child_process.hpp"
#include "app/model/files_logic.hpp"
#include "app/model/memory_logic.hpp"
#include "app/model/plot_logic.hpp"
#include "app/model/tuner_logic.hpp"
#include "profiler/analysis/allreduce.hpp"
#include "profiler/analysis/split_model.hpp"
#include "memory_test_util.hpp"
#include "store_test_util.hpp"

using namespace wb::app_model;
using Catch::Matchers::WithinAbs;
using Catch::Matchers::WithinRel;
using wb::test::TempDir;

TEST_CASE("recent files: newest first, no duplicates, bounded, persisted", "[app]") {
  std::vector<std::string> list = {"/a", "/b", "/c"};
  push_recent(list, "/b");
  CHECK(list == std::vector<std::string>{"/b", "/a", "/c"});
  push_recent(list, "/d", 3);
  CHECK(list == std::vector<std::string>{"/d", "/b", "/a"});
  TempDir dir;
  auto file = dir.path() / "cfg" / "wb-view" / "recent.txt";
  CHECK(read_recent(file).empty());
  REQUIRE(write_recent(file, list));
  CHECK(read_recent(file) == list);
}

TEST_CASE("directory listings put folders first and filter by extension", "[app]") {
  TempDir dir;
  std::filesystem::create_directories(dir.path() / "zdir");
  std::filesystem::create_directories(dir.path() / ".hidden");
  for (const char* f : {"b.sqlite", "a.sqlite", "c.txt", "r.safetensors"}) std::ofstream(dir.path() / f) << "x";
  auto all = list_directory(dir.path(), {});
  REQUIRE(all.size() == 5);
  CHECK(all[0].name == "zdir");
  CHECK(all[0].is_dir);
  CHECK(all[1].name == "a.sqlite");
  auto runs = list_directory(dir.path(), {".sqlite"});
  REQUIRE(runs.size() == 3);
  CHECK(runs[1].name == "a.sqlite");
  CHECK(runs[2].name == "b.sqlite");
  CHECK(runs[2].size == 1);
  CHECK(list_directory(dir.path() / "missing", {}).empty());
}
