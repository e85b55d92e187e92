// `wb import torch-trace`: import_torch_traces on arbitrary bytes (plain or gzipped JSON) into a run
// file; the scanner, the range trees, the layer mapping and the writer all run. A trace it cannot
// import is a TraceError naming the file; an import that succeeds must have written a run file.
#include <cstdlib>

#include "fuzz/fuzz_support.hpp"
#include "ingest/torch_trace.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const auto path = wb::fuzz::write_input("rank-0.pt.trace.json", data, size);
  const auto out = wb::fuzz::scratch_dir() / "imported.sqlite";
  wb::ingest::ImportOptions options;
  options.overwrite = true;
  WB_FUZZ_GUARD("torch_trace", wb::ingest::TraceError, path, {
    const wb::ingest::ImportResult result = wb::ingest::import_torch_traces({path}, out, options);
    if (result.traces.size() != 1 || !std::filesystem::is_regular_file(out)) std::abort();
  });
  return 0;
}
