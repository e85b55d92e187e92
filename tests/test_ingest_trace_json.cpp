// read_trace on large plain traces, which it parses in two halves at once: the result must be the one
// reader's (parse_trace of the same text), field by field and string id by string id, for Kineto's
// format and the legacy one, with metadata, memory events and names first seen in either half; a
// middle that falls inside a string is read by one reader; a truncated file is the serial parse's error.
#include <catch2/catch.hpp>

#include <filesystem>
#include <fstream>
#include <string>

#include "ingest/trace_json.hpp"
#include "support/temp_dir.hpp"

namespace fs = std::filesystem;
using namespace wb;

namespace {

// Bytes of text the traces below are made of: over read_trace's 32 MB split threshold.
constexpr std::size_t kBytes = std::size_t{40} << 20;

// One event as Kineto lays it out (a line per member group); `name` may carry what a test plants.
std::string kineto_event(std::size_t i, const std::string& name) {
  static const char* cats[] = {"cpu_op", "cuda_runtime", "kernel", "gpu_memcpy", "python_function"};
  std::string e = "  {\n    \"ph\": \"X\", \"cat\": \"" + std::string(cats[i % 5]) + "\", \"name\": \"" + name +
                  "\", \"pid\": 7, \"tid\": " + std::to_string(1 + i % 3) + ",\n    \"ts\": 1712195500" +
                  std::to_string(100000 + i) + ".125, \"dur\": " + std::to_string(i % 50) + ".5,\n    \"args\": {\n" +
                  "      \"External id\": " + std::to_string(i) + ", \"correlation\": " + std::to_string(i / 2) +
                  ", \"device\": 0, \"stream\": 7, \"grid\": [4, 1, 1], \"Sequence number\": " + std::to_string(i % 11) +
                  "\n    }\n  }";
  return e;
}

// A Kineto trace of about kBytes: metadata before and after traceEvents, names, threads and memory
// events in both halves, names that only the second half has, flows; name_of(i, byte) names event i,
// which starts at that byte.
template <class Name>
std::string kineto_trace(Name&& name_of) {
  std::string t = "{\n  \"schemaVersion\": 1,\n  \"deviceProperties\": [\n    {\"id\": 0, \"name\": \"GPU A\"}\n  ],\n"
                  "  \"traceEvents\": [\n  {\"ph\": \"M\", \"name\": \"thread_name\", \"pid\": 7, \"tid\": 1, "
                  "\"args\": {\"name\": \"main\"}}";
  for (std::size_t i = 0; t.size() < kBytes; ++i) {
    const bool late = t.size() > kBytes / 2;
    t += ",\n";
    if (i % 1000 == 17) {
      t += "  {\"ph\": \"i\", \"name\": \"[memory]\", \"pid\": 7, \"tid\": 2, \"ts\": 17121955" + std::to_string(i) +
           ", \"args\": {\"Bytes\": " + std::to_string(512 + i) + ", \"Total Allocated\": " + std::to_string(i * 4) +
           ", \"Device Type\": 1}}";
    } else if (i % 1000 == 33) {
      t += "  {\"ph\": \"s\", \"cat\": \"ac2g\", \"name\": \"flow\", \"pid\": 7, \"tid\": 1, \"ts\": 1, \"id\": 3}";
    } else if (late && i % 5000 == 0) {
      t += "  {\"ph\": \"M\", \"name\": \"thread_name\", \"pid\": 7, \"tid\": " + std::to_string(10 + i % 7) +
           ", \"args\": {\"name\": \"worker " + std::to_string(i) + "\"}}";
    } else {
      t += kineto_event(i, name_of(i, t.size()));
    }
  }
  t += "\n  ],\n  \"distributedInfo\": {\"rank\": 3, \"world_size\": 8},\n  \"traceName\": \"t\"\n}\n";
  return t;
}

std::string plain_name(std::size_t i, std::size_t at) {
  const bool late = at > kBytes / 2;  // names the second half has alone
  return late && i % 3 == 0 ? "late::op_" + std::to_string(i % 101) : "aten::op_" + std::to_string(i % 97);
}

fs::path write(const wb::test::TempDir& dir, const std::string& name, const std::string& text) {
  const fs::path p = dir.path() / name;
  std::ofstream(p, std::ios::binary) << text;
  return p;
}

void require_same(const ingest::ParsedTrace& a, const ingest::ParsedTrace& b) {
  CHECK(a.format == b.format);
  REQUIRE(a.strings == b.strings);
  REQUIRE(a.events.size() == b.events.size());
  std::size_t differ = 0;
  for (std::size_t i = 0; i < a.events.size(); ++i) {
    const ingest::TraceEvent &x = a.events[i], &y = b.events[i];
    const bool same = x.ts_ns == y.ts_ns && x.dur_ns == y.dur_ns && x.external_id == y.external_id &&
                      x.correlation == y.correlation && x.sequence == y.sequence && x.fwd_tid == y.fwd_tid &&
                      x.bytes == y.bytes && x.grid[0] == y.grid[0] && x.name == y.name && x.pid == y.pid &&
                      x.tid == y.tid && x.device == y.device && x.stream == y.stream && x.cat == y.cat && x.ph == y.ph;
    differ += same ? 0 : 1;
  }
  CHECK(differ == 0);
  for (int c = 0; c < ingest::kEventCats; ++c) CHECK(a.events_by_cat[c] == b.events_by_cat[c]);
  CHECK(a.thread_names == b.thread_names);
  CHECK(a.process_names == b.process_names);
  REQUIRE(a.memory.size() == b.memory.size());
  for (std::size_t i = 0; i < a.memory.size(); ++i) {
    CHECK(a.memory[i].ts_ns == b.memory[i].ts_ns);
    CHECK(a.memory[i].bytes == b.memory[i].bytes);
    CHECK(a.memory[i].total == b.memory[i].total);
    CHECK((a.memory[i].pid == b.memory[i].pid && a.memory[i].tid == b.memory[i].tid));
  }
  CHECK(a.other_categories == b.other_categories);
  CHECK(a.device_properties == b.device_properties);
  CHECK(a.distributed_info == b.distributed_info);
  CHECK(a.max_memory_allocated == b.max_memory_allocated);
}

}  // namespace

TEST_CASE("a large Kineto trace read in two halves equals one reader's parse, string ids included", "[ingest]") {
  wb::test::TempDir dir;
  const std::string text = kineto_trace(plain_name);
  const fs::path file = write(dir, "big.json", text);
  const ingest::ParsedTrace one = ingest::parse_trace(text, file.string());
  const ingest::ParsedTrace two = ingest::read_trace(file);
  CHECK(two.readers == 2);
  CHECK(one.readers == 1);
  CHECK(one.events.size() > 100000);
  CHECK(one.memory.size() > 50);
  CHECK(one.thread_names.size() > 2);  // names from both halves
  CHECK(one.distributed_info.value("rank", -1) == 3);  // after traceEvents: the second reader's
  CHECK(one.device_properties.size() == 1);            // before it: the first's
  require_same(one, two);
}

TEST_CASE("a large legacy trace read in two halves equals one reader's parse", "[ingest]") {
  wb::test::TempDir dir;
  std::string text = "[";
  for (std::size_t i = 0; text.size() < kBytes; ++i) {
    text += i == 0 ? "\n" : ",\n";
    text += "{\"name\": \"" + plain_name(i, text.size()) + "\", \"ph\": \"X\", \"ts\": " +
            std::to_string(1000 + i * 3) + ", \"dur\": " + std::to_string(i % 9) +
            ", \"tid\": 1, \"pid\": \"CPU functions\", \"args\": {}}";
  }
  text += "\n]\n";
  const fs::path file = write(dir, "legacy.json", text);
  const ingest::ParsedTrace one = ingest::parse_trace(text, file.string());
  const ingest::ParsedTrace two = ingest::read_trace(file);
  CHECK(two.readers == 2);
  CHECK(two.format == ingest::TraceFormat::legacy);
  require_same(one, two);
}

TEST_CASE("a middle inside a string is read by one reader; a truncated large file is the one reader's error",
          "[ingest]") {
  wb::test::TempDir dir;
  // One event's name of 4 MB, "}, {" over and over, spans the middle of the file: the split's candidate
  // is inside a string.
  bool planted = false;
  const std::string text = kineto_trace([&](std::size_t i, std::size_t at) {
    if (planted || at < kBytes / 2 - (std::size_t{2} << 20)) return plain_name(i, at);
    planted = true;
    std::string odd;
    while (odd.size() < (std::size_t{4} << 20)) odd += "x}, {";
    return odd;
  });
  const fs::path file = write(dir, "odd.json", text);
  const ingest::ParsedTrace one = ingest::parse_trace(text, file.string());
  const ingest::ParsedTrace read = ingest::read_trace(file);
  CHECK(read.readers == 1);
  require_same(one, read);

  const std::string cut = kineto_trace(plain_name).substr(0, kBytes - 4096);
  const fs::path truncated = write(dir, "cut.json", cut);
  std::string serial, halves;
  try {
    (void)ingest::parse_trace(cut, truncated.string());
  } catch (const ingest::TraceError& e) {
    serial = e.what();
  }
  try {
    (void)ingest::read_trace(truncated);
  } catch (const ingest::TraceError& e) {
    halves = e.what();
  }
  CHECK(serial.find("truncated JSON: the file ends at byte " + std::to_string(cut.size())) != std::string::npos);
  CHECK(halves == serial);
}
