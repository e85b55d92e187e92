#include "profiler/record/cuda/cupti_api.hpp"

#include <cuda_runtime_api.h>
#include <dlfcn.h>

#include <atomic>
#include <cstdlib>
#include <mutex>
#include <vector>

#include "profiler/record/recorder.hpp"

namespace wb::profiler::cuda {

namespace {

std::vector<std::string> candidates() {
  if (const char* env = std::getenv("WB_CUPTI_LIBRARY"); env != nullptr && *env != '\0') return {env};
  std::vector<std::string> out = {"libcupti.so." + std::to_string(CUDART_VERSION / 1000)};
#ifdef WB_CUPTI_BUILD_LIBRARY
  out.push_back(WB_CUPTI_BUILD_LIBRARY);
#endif
  return out;
}

template <class Fn>
void resolve(void* lib, const char* symbol, Fn& fn, const std::string& path) {
  dlerror();
  void* p = dlsym(lib, symbol);
  if (p == nullptr) {
    const char* e = dlerror();
    throw ProfilerError("CUPTI: " + path + " has no " + symbol + (e != nullptr ? std::string(" (") + e + ")" : ""));
  }
  fn = reinterpret_cast<Fn>(p);
}

struct Loaded {
  CuptiApi api;
  std::string error;  // "" when loaded
};

Loaded load() {
  Loaded out;
  std::string tried;
  void* lib = nullptr;
  std::string path;
  for (const std::string& c : candidates()) {
    lib = dlopen(c.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (lib != nullptr) {
      path = c;
      break;
    }
    const char* e = dlerror();
    tried += (tried.empty() ? "" : "; ") + c + ": " + (e != nullptr ? e : "not found");
  }
  if (lib == nullptr) {
    out.error = "CUPTI could not be loaded (" + tried +
                "); put CUPTI's lib folder on LD_LIBRARY_PATH or set WB_CUPTI_LIBRARY to the library";
    return out;
  }
  try {
    CuptiApi& a = out.api;
    resolve(lib, "cuptiGetResultString", a.get_result_string, path);
    resolve(lib, "cuptiActivityGetNextRecord", a.get_next_record, path);
    resolve(lib, "cuptiActivityGetNumDroppedRecords", a.get_num_dropped_records, path);
    resolve(lib, "cuptiActivityPushExternalCorrelationId", a.push_external_correlation_id, path);
    resolve(lib, "cuptiActivityPopExternalCorrelationId", a.pop_external_correlation_id, path);
    resolve(lib, "cuptiActivityRegisterTimestampCallback", a.register_timestamp_callback, path);
    resolve(lib, "cuptiActivityRegisterCallbacks", a.register_callbacks, path);
    resolve(lib, "cuptiActivityEnable", a.enable, path);
    resolve(lib, "cuptiActivityDisable", a.disable, path);
    resolve(lib, "cuptiActivityFlushAll", a.flush_all, path);
  } catch (const ProfilerError& e) {
    out.error = e.what();
    dlclose(lib);
  }
  return out;
}

std::mutex g_mutex;
CuptiApi g_table;
std::atomic<const CuptiApi*> g_api{nullptr};

}  // namespace

// A failure is not kept: a later call (another WB_CUPTI_LIBRARY, a library put in place) tries again.
const CuptiApi& cupti() {
  if (const CuptiApi* a = g_api.load(std::memory_order_acquire)) return *a;
  std::lock_guard lk(g_mutex);
  if (const CuptiApi* a = g_api.load(std::memory_order_acquire)) return *a;
  Loaded l = load();
  if (!l.error.empty()) throw ProfilerError(l.error);
  g_table = l.api;
  g_api.store(&g_table, std::memory_order_release);
  return g_table;
}

const CuptiApi* cupti_if_loaded() { return g_api.load(std::memory_order_acquire); }

}  // namespace wb::profiler::cuda
