// CUPTI, loaded when tracing starts (dlopen), never linked: a binary built with CUDA starts and runs on a
// machine without CUPTI, and only GPU kernel tracing is then off, with the reason. The library is
// $WB_CUPTI_LIBRARY when set, else libcupti.so.<CUDA major> on the loader's path (LD_LIBRARY_PATH, the
// binary's run path), else the one in the toolkit this was built with.
#pragma once

#include <cupti.h>

#include <string>

namespace wb::profiler::cuda {

// The CUPTI entry points the tracer uses, resolved from the loaded library.
struct CuptiApi {
  decltype(&cuptiGetResultString) get_result_string = nullptr;
  decltype(&cuptiActivityGetNextRecord) get_next_record = nullptr;
  decltype(&cuptiActivityGetNumDroppedRecords) get_num_dropped_records = nullptr;
  decltype(&cuptiActivityPushExternalCorrelationId) push_external_correlation_id = nullptr;
  decltype(&cuptiActivityPopExternalCorrelationId) pop_external_correlation_id = nullptr;
  decltype(&cuptiActivityRegisterTimestampCallback) register_timestamp_callback = nullptr;
  decltype(&cuptiActivityRegisterCallbacks) register_callbacks = nullptr;
  decltype(&cuptiActivityEnable) enable = nullptr;
  decltype(&cuptiActivityDisable) disable = nullptr;
  decltype(&cuptiActivityFlushAll) flush_all = nullptr;
};

// Loads CUPTI on the first call (later calls return the same table, or throw the same error). Throws
// ProfilerError naming the library it tried and dlopen's or dlsym's message.
const CuptiApi& cupti();

// The table if CUPTI has been loaded, else nullptr (never loads).
const CuptiApi* cupti_if_loaded();

}  // namespace wb::profiler::cuda
