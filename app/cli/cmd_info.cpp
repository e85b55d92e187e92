// wb info RUN [--json]: what a run file holds, at a glance.
#include <cstdio>
#include <iostream>

#include <nlohmann/json.hpp>

#include "app/cli/cli.hpp"
#include "store/reader.hpp"

namespace wb::cli {

int cmd_info(int argc, char** argv) {
  Args args(argc, argv,
            "usage: wb info RUN [--json]\n"
            "Shows a run file's metadata, ranks, rows per table, whether it is complete, and dropped events.\n"
            "  --json   print the same as one JSON object",
            {{"--json", false}});
  const auto& pos = args.positionals(1, 1);
  store::Reader reader(pos[0]);
  auto meta = reader.meta();
  auto ranks = reader.ranks();
  auto counts = reader.row_counts();
  auto get = [&](const char* key, const char* fallback) {
    auto it = meta.find(key);
    return it == meta.end() ? std::string(fallback) : it->second;
  };
  bool complete = get("complete", "0") == "1";

  if (args.has("--json")) {
    nlohmann::json j;
    j["path"] = pos[0];
    j["complete"] = complete;
    j["meta"] = meta;
    j["rows"] = counts;
    j["ranks"] = nlohmann::json::array();
    for (const auto& r : ranks)
      j["ranks"].push_back({{"rank", r.rank},
                            {"host", r.host},
                            {"device", r.device},
                            {"pid", r.pid},
                            {"clock_offset_ns", r.clock_offset_ns},
                            {"clock_offset_end_ns", r.clock_offset_end_ns},
                            {"dropped_events", r.dropped_events}});
    std::cout << j.dump(2) << "\n";
    return 0;
  }

  std::printf("run            %s\n", pos[0].c_str());
  std::printf("schema         %s\n", get("schema_version", "?").c_str());
  std::printf("created        %s\n", get("created_utc", "?").c_str());
  std::printf("complete       %s\n", complete ? "yes" : "no (still recording, killed, or a recording error)");
  std::printf("world size     %s\n", get("world_size", "1").c_str());
  std::printf("device         %s\n", get("device", "?").c_str());
  std::printf("dropped events %s\n", get("dropped_events", "0").c_str());
  for (const auto& [k, v] : meta) {
    if (k == "schema_version" || k == "created_utc" || k == "complete" || k == "world_size" || k == "device" ||
        k == "dropped_events")
      continue;
    // config_json and an import's layer_match can be long: show their size, `wb info --json` prints them.
    if (k == "config_json" || v.size() > 200)
      std::printf("%-14s (%zu bytes; wb info --json prints it whole)\n", k.c_str(), v.size());
    else
      std::printf("%-14s %s\n", k.c_str(), v.c_str());
  }
  std::printf("\nranks\n  %-5s %-20s %-10s %-8s %16s %16s %8s\n", "rank", "host", "device", "pid", "clock_offset_ns",
              "offset_end_ns", "dropped");
  for (const auto& r : ranks)
    std::printf("  %-5d %-20s %-10s %-8lld %16lld %16lld %8lld\n", r.rank, r.host.c_str(), r.device.c_str(),
                static_cast<long long>(r.pid), static_cast<long long>(r.clock_offset_ns),
                static_cast<long long>(r.clock_offset_end_ns), static_cast<long long>(r.dropped_events));
  std::printf("\nrows\n");
  for (const auto& [table, n] : counts) std::printf("  %-16s %12lld\n", table.c_str(), static_cast<long long>(n));
  return 0;
}

}  // namespace wb::cli
