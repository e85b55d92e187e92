// Launcher helpers: rank/size/local rank from the environment, threads per rank, and the mpirun
// command line that --nproc execs (root flags, oversubscription, binding, forwarded variables).

#include <catch2/catch.hpp>

#include <algorithm>
#include <cstdlib>
#include <string>
#include <vector>

#include "trainer/parallel/error.hpp"
#include "trainer/parallel/launch.hpp"

using namespace wb::parallel;

namespace {

bool contains_sequence(const std::vector<std::string>& v, const std::vector<std::string>& seq) {
  for (std::size_t i = 0; i + seq.size() <= v.size(); ++i) {
    if (std::equal(seq.begin(), seq.end(), v.begin() + static_cast<std::ptrdiff_t>(i))) return true;
  }
  return false;
}

std::size_t count_of(const std::vector<std::string>& v, const std::string& s) {
  return static_cast<std::size_t>(std::count(v.begin(), v.end(), s));
}

}  // namespace

TEST_CASE("launch info from OpenMPI, PMI, and no launcher", "[parallel]") {
  SECTION("OpenMPI") {
    const auto info = launch_info_from({{"OMPI_COMM_WORLD_RANK", "3"},
                                        {"OMPI_COMM_WORLD_SIZE", "8"},
                                        {"OMPI_COMM_WORLD_LOCAL_RANK", "1"},
                                        {"OMPI_COMM_WORLD_LOCAL_SIZE", "4"}});
    REQUIRE(info.launcher == "openmpi");
    REQUIRE(info.rank == 3);
    REQUIRE(info.world_size == 8);
    REQUIRE(info.local_rank == 1);
    REQUIRE(info.local_size == 4);
  }
  SECTION("PMI (MPICH hydra)") {
    const auto info = launch_info_from({{"PMI_RANK", "2"}, {"PMI_SIZE", "4"}, {"MPI_LOCALRANKID", "0"}});
    REQUIRE(info.launcher == "pmi");
    REQUIRE(info.rank == 2);
    REQUIRE(info.world_size == 4);
    REQUIRE(info.local_rank == 0);
    REQUIRE(info.local_size == 4);
  }
  SECTION("PMI without a local rank: one host") {
    const auto info = launch_info_from({{"PMI_RANK", "1"}, {"PMI_SIZE", "2"}});
    REQUIRE(info.local_rank == 1);
  }
  SECTION("not launched") {
    const auto info = launch_info_from({{"PATH", "/usr/bin"}});
    REQUIRE(info.launcher == "none");
    REQUIRE(info.rank == 0);
    REQUIRE(info.world_size == 1);
    REQUIRE(info.local_rank == 0);
  }
}

TEST_CASE("bad launcher environment is a clear error", "[parallel]") {
  REQUIRE_THROWS_AS(launch_info_from({{"OMPI_COMM_WORLD_RANK", "x"}, {"OMPI_COMM_WORLD_SIZE", "2"}}), DistError);
  REQUIRE_THROWS_AS(launch_info_from({{"OMPI_COMM_WORLD_RANK", "2"}, {"OMPI_COMM_WORLD_SIZE", "2"}}), DistError);
  REQUIRE_THROWS_AS(launch_info_from({{"OMPI_COMM_WORLD_RANK", "0"}, {"OMPI_COMM_WORLD_SIZE", "0"}}), DistError);
  REQUIRE_THROWS_AS(launch_info_from({{"PMI_RANK", "-1"}, {"PMI_SIZE", "2"}}), DistError);
  try {
    launch_info_from({{"OMPI_COMM_WORLD_RANK", "1x"}, {"OMPI_COMM_WORLD_SIZE", "2"}});
    FAIL("no error");
  } catch (const DistError& e) {
    REQUIRE(std::string(e.what()).find("OMPI_COMM_WORLD_RANK='1x'") != std::string::npos);
  }
}

TEST_CASE("threads per rank share the host's cores", "[parallel]") {
  LaunchInfo info;
  info.local_size = 2;
  REQUIRE(default_threads(info, 16) == 8);
  REQUIRE(default_threads(info, 2) == 1);
  info.local_size = 4;
  REQUIRE(default_threads(info, 2) == 1);  // never zero
  REQUIRE(default_threads(LaunchInfo{}, 2) == 2);
}

TEST_CASE("the mpirun command line for --nproc", "[parallel]") {
  const std::vector<std::string> args = {"--steps", "3", "--nproc", "2", "--data", "synthetic", "--nproc=2"};
  const Environment env = {{"PATH", "/usr/bin"}, {"OMP_PROC_BIND", "false"}, {"WB_TRACE", "1"}, {"SECRET_TOKEN", "x"}};
  SECTION("as root") {
    const auto cmd = mpirun_command(2, "/opt/wb/bin/wb-train", args, true, env);
    CAPTURE(cmd);
    REQUIRE(cmd.front() == "mpirun");
    REQUIRE(contains_sequence(cmd, {"-np", "2"}));
    REQUIRE(count_of(cmd, "--oversubscribe") == 1);
    REQUIRE(contains_sequence(cmd, {"--bind-to", "none"}));
    REQUIRE(count_of(cmd, "--allow-run-as-root") == 1);
    REQUIRE(contains_sequence(cmd, {"-x", "PATH"}));
    REQUIRE(contains_sequence(cmd, {"-x", "OMP_PROC_BIND"}));
    REQUIRE(contains_sequence(cmd, {"-x", "WB_TRACE"}));
    REQUIRE(count_of(cmd, "SECRET_TOKEN") == 0);
    // The program, then its arguments without --nproc.
    REQUIRE(contains_sequence(cmd, {"/opt/wb/bin/wb-train", "--steps", "3", "--data", "synthetic"}));
    REQUIRE(cmd.back() == "synthetic");
    REQUIRE(count_of(cmd, "--nproc") == 0);
    REQUIRE(count_of(cmd, "--nproc=2") == 0);
  }
  SECTION("as a user, with WB_MPIRUN") {
    Environment with = env;
    with["WB_MPIRUN"] = "/opt/openmpi/bin/mpirun";
    const auto cmd = mpirun_command(3, "/x/wb-train", args, false, with);
    REQUIRE(cmd.front() == "/opt/openmpi/bin/mpirun");
    REQUIRE(contains_sequence(cmd, {"-np", "3"}));
    REQUIRE(count_of(cmd, "--allow-run-as-root") == 0);
  }
  REQUIRE(strip_nproc(std::vector<std::string>{"--nproc", "4"}).empty());
  REQUIRE(strip_nproc(std::vector<std::string>{"a", "--nproc=4", "b"}) == std::vector<std::string>{"a", "b"});
}

TEST_CASE("relaunch failures are clear errors and return", "[parallel]") {
  char prog[] = "wb-train";
  char* argv[] = {prog, nullptr};
  REQUIRE_THROWS_AS(relaunch_under_mpirun(0, 1, argv), DistError);

  SECTION("already under a launcher") {
    setenv("OMPI_COMM_WORLD_SIZE", "2", 1);
    setenv("OMPI_COMM_WORLD_RANK", "0", 1);
    REQUIRE_THROWS_AS(relaunch_under_mpirun(2, 1, argv), DistError);
    unsetenv("OMPI_COMM_WORLD_SIZE");
    unsetenv("OMPI_COMM_WORLD_RANK");
  }
  SECTION("mpirun missing") {
    setenv("WB_MPIRUN", "/nonexistent/wb-parallel-test/mpirun", 1);
    try {
      relaunch_under_mpirun(2, 1, argv);
      FAIL("returned without error");
    } catch (const DistError& e) {
      const std::string what = e.what();
      CAPTURE(what);
      REQUIRE(what.find("/nonexistent/wb-parallel-test/mpirun") != std::string::npos);
      REQUIRE(what.find("No such file") != std::string::npos);
    }
    unsetenv("WB_MPIRUN");
  }
}
