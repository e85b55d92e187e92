// WB_PROFILE=OFF: the recording calls compile to nothing. This file builds them as an OFF build would,
// whatever the build's setting, and checks that they are empty and record nothing.
#undef WB_PROFILE
#include <catch2/catch.hpp>

#include <filesystem>
#include <string>
#include <type_traits>

#include "profiler/record/recorder.hpp"
#include "store/reader.hpp"
#include "store/writer.hpp"
#include "support/temp_dir.hpp"

namespace fs = std::filesystem;
using namespace wb;

TEST_CASE("with WB_PROFILE off, Range is an empty type and records nothing", "[profiler]") {
  STATIC_REQUIRE(std::is_empty_v<profiler::Range>);
  STATIC_REQUIRE(std::is_same_v<profiler::Range, profiler::disabled_build::Range>);

  const wb::test::TempDir dir;
  {
    store::WriterOptions wo;
    wo.path = dir / "run.sqlite";
    wo.handle_signals = false;
    store::Writer writer(wo);
    profiler::Recorder rec(writer);  // running and enabled: only the compiled-out calls are silent
    profiler::NameId id = rec.intern("op");
    profiler::CounterTrack q = rec.add_counter_track("batch queue");
    for (int i = 0; i < 1000; ++i) {
      profiler::Range r(id, profiler::Category::forward);
      profiler::counter(q, 3.0);
      profiler::record_range(id, profiler::Category::data, 0, 10);
    }
    rec.stop();
    writer.finish();
  }
  store::Reader reader(dir / "run.sqlite");
  auto counts = reader.row_counts();
  CHECK(counts["range"] == 0);
  CHECK(counts["counter"] == 0);
}
