// Opening a run file: open_run's validation, then everything `wb report` reads (load_run) and writes.
#include <cstdlib>
#include <sstream>

#include "fuzz/fuzz_support.hpp"
#include "profiler/analysis/report.hpp"
#include "profiler/analysis/run_data.hpp"
#include "store/db.hpp"
#include "store/reader.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const auto path = wb::fuzz::write_input("run.sqlite", data, size);
  std::error_code ec;
  std::filesystem::remove(path.string() + "-journal", ec);
  std::filesystem::remove(path.string() + "-wal", ec);
  WB_FUZZ_GUARD("runfile", wb::store::StoreError, path, {
    wb::store::Reader reader(path);
    for (const auto& info : reader.tensors()) {
      (void)reader.tensor(info.source, info.kind, info.name, info.step, info.rank);
    }
    (void)reader.comparisons();
    try {
      wb::analysis::RunData run = wb::analysis::load_run(reader);
      std::ostringstream report;
      wb::analysis::write_report(run, report);
    } catch (const wb::analysis::AnalysisError& e) {
      if (std::string(e.what()).empty()) std::abort();
    }
  });
  return 0;
}
