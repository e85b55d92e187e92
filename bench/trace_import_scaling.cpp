// How `wb import torch-trace` scales with the trace's length: a real Kineto trace's ProfilerSteps
// replicated K times (each copy shifted in time by the trace's span, its correlation / External id /
// flow id / sequence numbers offset so that every link stays unique), imported by the real wb binary for
// each K: wall time, events/s and the child's peak RSS (wait4's ru_maxrss), then the exponent of time vs
// events fitted by least squares on log-log (1.00: linear). Goals: >= 1M events/s, peak RSS <= 1 GB for a
// 2 GB trace, exponent near 1.
//
// usage: trace_import_scaling --trace FILE.json[.gz] [--copies 4,16,64] [--wb PATH] [--dir DIR] [--keep]
//        trace_import_scaling --trace FILE.json[.gz] --write-only --copies K --out OUT.json
//
// Copy 0 is the trace's events as they are (the text around them too; only the whitespace between events
// changes); copies 1..K-1 repeat the events from the first ProfilerStep's start on, metadata left out,
// shifted by k times the trace's span, ProfilerStep#N renamed to continue the numbering. The replicated traces are written as plain .json to a temporary folder and removed after
// their import (--keep leaves them).
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "bench/bench_util.hpp"

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

namespace {

[[noreturn]] void die(const std::string& what) {
  std::fprintf(stderr, "trace_import_scaling: %s\n", what.c_str());
  std::exit(2);
}

// The whole file, gunzipped when it starts with gzip's magic bytes.
std::string read_text(const fs::path& path) {
  gzFile f = gzopen(path.c_str(), "rb");  // reads plain files as they are
  if (f == nullptr) die(path.string() + ": cannot open");
  std::string text;
  std::vector<char> buf(1 << 20);
  int n = 0;
  while ((n = gzread(f, buf.data(), static_cast<unsigned>(buf.size()))) > 0) text.append(buf.data(), static_cast<std::size_t>(n));
  int err = 0;
  const char* msg = gzerror(f, &err);
  if (n < 0 || (err != Z_OK && err != Z_STREAM_END)) die(path.string() + ": cannot read (" + msg + ")");
  gzclose(f);
  return text;
}

// A minimal JSON walker over the trace's text: enough to find the events of "traceEvents" and, in each,
// the members to rewrite. The trace is assumed valid (wb's own reader checks that).
struct Walker {
  std::string_view t;
  std::size_t i = 0;

  void ws() {
    while (i < t.size() && (t[i] == ' ' || t[i] == '\n' || t[i] == '\r' || t[i] == '\t')) ++i;
  }
  // A string at i: its raw content (escapes left as they are).
  std::string_view string() {
    const std::size_t s = ++i;
    while (i < t.size() && t[i] != '"') i += t[i] == '\\' ? 2 : 1;
    if (i >= t.size()) die("unterminated string in the trace");
    return t.substr(s, i++ - s);
  }
  void value() {
    ws();
    if (i >= t.size()) die("the trace ends inside a value");
    const char c = t[i];
    if (c == '"') {
      string();
    } else if (c == '{' || c == '[') {
      const char close = c == '{' ? '}' : ']';
      ++i;
      ws();
      if (t[i] == close) {
        ++i;
        return;
      }
      while (true) {
        ws();
        if (c == '{') {
          string();
          ws();
          ++i;  // ':'
        }
        value();
        ws();
        if (t[i++] == close) return;
      }
    } else {
      while (i < t.size() && std::strchr(",}] \n\r\t", t[i]) == nullptr) ++i;
    }
  }
};

// Microseconds as the trace writes them ("1712195495519689.047") to integer nanoseconds, exactly for up
// to three decimals.
std::optional<std::int64_t> us_to_ns(std::string_view s) {
  if (s.empty() || s.find_first_of("eE-") != std::string_view::npos) return std::nullopt;
  std::int64_t whole = 0, frac = 0;
  std::size_t k = 0;
  for (; k < s.size() && s[k] != '.'; ++k) whole = whole * 10 + (s[k] - '0');
  int digits = 0;
  if (k < s.size()) {
    for (++k; k < s.size(); ++k, ++digits) {
      if (digits >= 3) return std::nullopt;
      frac = frac * 10 + (s[k] - '0');
    }
  }
  for (; digits < 3; ++digits) frac *= 10;
  return whole * 1000 + frac;
}

std::string ns_to_us(std::int64_t ns) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%lld.%03lld", static_cast<long long>(ns / 1000), static_cast<long long>(ns % 1000));
  return buf;
}

// One event as a template: literal pieces and the slots each copy rewrites.
struct Slot {
  enum Kind { ts, id, step } kind;
  std::size_t begin, end;  // the value's text in the event
  std::int64_t value;      // ns for ts, the id, the step number
};
struct Event {
  std::string_view text;
  std::vector<Slot> slots;
  std::int64_t ts_ns = -1;
  bool metadata = false;
};

struct Trace {
  std::string text;
  std::string_view head, tail;  // before the first event, after the last
  std::vector<Event> events;
  std::int64_t start_ns = std::numeric_limits<std::int64_t>::max(), end_ns = 0;
  std::int64_t first_step_ns = -1;
  std::int64_t max_id = 0, steps = 0, min_step = std::numeric_limits<std::int64_t>::max(), max_step = -1;
};

bool is_id_key(std::string_view k) {
  return k == "correlation" || k == "External id" || k == "external id" || k == "Sequence number";
}

// The members of one event: ts and dur at the top, "id" of flows, the link ids in args, and the name.
void scan_event(Trace& tr, Event& ev) {
  Walker w{ev.text};
  ++w.i;  // '{'
  std::string_view name;
  std::int64_t dur = 0;
  std::size_t name_begin = 0;
  while (true) {
    w.ws();
    if (w.t[w.i] == '}') break;
    const std::string_view key = w.string();
    w.ws();
    ++w.i;  // ':'
    w.ws();
    const std::size_t vb = w.i;
    if (key == "args" && w.t[w.i] == '{') {
      ++w.i;
      while (true) {
        w.ws();
        if (w.t[w.i] == '}') {
          ++w.i;
          break;
        }
        const std::string_view ak = w.string();
        w.ws();
        ++w.i;
        w.ws();
        const std::size_t ab = w.i;
        w.value();
        const std::string_view av = ev.text.substr(ab, w.i - ab);
        if (is_id_key(ak) && !av.empty() && av[0] >= '0' && av[0] <= '9') {
          const std::int64_t v = std::strtoll(std::string(av).c_str(), nullptr, 10);
          ev.slots.push_back({Slot::id, ab, w.i, v});
          tr.max_id = std::max(tr.max_id, v);
        }
        w.ws();
        if (w.t[w.i] == ',') ++w.i;
      }
    } else {
      w.value();
      const std::string_view v = ev.text.substr(vb, w.i - vb);
      if (key == "ts") {
        const auto ns = us_to_ns(v);
        if (!ns) die("a \"ts\" this bench cannot shift exactly: " + std::string(v));
        ev.ts_ns = *ns;
        ev.slots.push_back({Slot::ts, vb, w.i, *ns});
      } else if (key == "dur") {
        dur = us_to_ns(v).value_or(0);
      } else if (key == "id" && !v.empty() && v[0] >= '0' && v[0] <= '9') {
        const std::int64_t id = std::strtoll(std::string(v).c_str(), nullptr, 10);
        ev.slots.push_back({Slot::id, vb, w.i, id});
        tr.max_id = std::max(tr.max_id, id);
      } else if (key == "name" && !v.empty() && v[0] == '"') {
        name = v.substr(1, v.size() - 2);
        name_begin = vb + 1;
      } else if (key == "ph") {
        ev.metadata = v == "\"M\"";
      }
    }
    w.ws();
    if (w.t[w.i] == ',') ++w.i;
  }
  std::sort(ev.slots.begin(), ev.slots.end(), [](const Slot& a, const Slot& b) { return a.begin < b.begin; });
  if (ev.metadata || ev.ts_ns < 0) return;
  tr.start_ns = std::min(tr.start_ns, ev.ts_ns);
  tr.end_ns = std::max(tr.end_ns, ev.ts_ns + std::max<std::int64_t>(dur, 0));
  constexpr std::string_view kStep = "ProfilerStep#";
  if (name.substr(0, kStep.size()) == kStep) {
    const std::int64_t n = std::strtoll(std::string(name.substr(kStep.size())).c_str(), nullptr, 10);
    const std::size_t b = name_begin + kStep.size();
    ev.slots.push_back({Slot::step, b, b + (name.size() - kStep.size()), n});
    tr.max_step = std::max(tr.max_step, n);
    tr.min_step = std::min(tr.min_step, n);
    ++tr.steps;
    if (tr.first_step_ns < 0 || ev.ts_ns < tr.first_step_ns) tr.first_step_ns = ev.ts_ns;
    std::sort(ev.slots.begin(), ev.slots.end(), [](const Slot& a, const Slot& b) { return a.begin < b.begin; });
  }
}

Trace load(const fs::path& path) {
  Trace tr;
  tr.text = read_text(path);
  Walker w{tr.text};
  w.ws();
  if (w.i >= w.t.size() || w.t[w.i] != '{') die(path.string() + ": expected a Kineto trace (a JSON object with traceEvents)");
  ++w.i;
  while (true) {
    w.ws();
    if (w.i >= w.t.size() || w.t[w.i] == '}') break;
    const std::string_view key = w.string();
    w.ws();
    ++w.i;
    w.ws();
    if (key != "traceEvents") {
      w.value();
    } else {
      if (w.t[w.i] != '[') die("\"traceEvents\" is no list");
      ++w.i;
      while (true) {
        w.ws();
        if (w.t[w.i] == ']') break;
        const std::size_t b = w.i;
        w.value();
        if (tr.events.empty()) tr.head = std::string_view(tr.text).substr(0, b);
        tr.events.push_back(Event{std::string_view(tr.text).substr(b, w.i - b), {}, -1, false});
        tr.tail = std::string_view(tr.text).substr(w.i);
        w.ws();
        if (w.t[w.i] == ',') ++w.i;
      }
      ++w.i;
    }
    w.ws();
    if (w.i < w.t.size() && w.t[w.i] == ',') ++w.i;
  }
  if (tr.events.empty()) die(path.string() + ": no traceEvents");
  for (auto& ev : tr.events) scan_event(tr, ev);
  if (tr.steps == 0) die(path.string() + ": no ProfilerStep# events to replicate");
  return tr;
}

// Writes the K-copy trace; returns its events (entries of traceEvents).
std::int64_t write_copies(const Trace& tr, int copies, const fs::path& out, std::size_t& bytes) {
  std::ofstream f(out, std::ios::binary);
  if (!f) die(out.string() + ": cannot write");
  std::vector<char> obuf(8 << 20);
  f.rdbuf()->pubsetbuf(obuf.data(), static_cast<std::streamsize>(obuf.size()));
  const std::int64_t span = tr.end_ns - tr.start_ns + 1000;  // one microsecond apart
  const std::int64_t id_stride = tr.max_id + 1;
  const std::int64_t step_stride = tr.max_step - tr.min_step + 1;
  bytes = 0;
  auto put = [&](std::string_view s) {
    f.write(s.data(), static_cast<std::streamsize>(s.size()));
    bytes += s.size();
  };
  put(tr.head);
  std::int64_t events = 0;
  for (std::size_t e = 0; e < tr.events.size(); ++e) {
    if (e > 0) put(",\n");
    put(tr.events[e].text);
    ++events;
  }
  std::string piece;
  for (int k = 1; k < copies; ++k) {
    for (const Event& ev : tr.events) {
      if (ev.metadata || ev.ts_ns < tr.first_step_ns) continue;
      piece.assign(",\n");
      std::size_t at = 0;
      for (const Slot& s : ev.slots) {
        piece.append(ev.text.substr(at, s.begin - at));
        switch (s.kind) {
          case Slot::ts: piece += ns_to_us(s.value + k * span); break;
          case Slot::id: piece += std::to_string(s.value + k * id_stride); break;
          case Slot::step: piece += std::to_string(s.value + k * step_stride); break;
        }
        at = s.end;
      }
      piece.append(ev.text.substr(at));
      put(piece);
      ++events;
    }
  }
  put(tr.tail);
  f.flush();
  if (!f) die(out.string() + ": write failed (disk full?)");
  return events;
}

struct Child {
  double seconds = 0;
  double max_rss_mb = 0;
  int status = 0;
};

// Runs argv, its output to the bench's stderr; wall time and peak RSS from wait4.
Child run_child(const std::vector<std::string>& args) {
  std::vector<char*> argv;
  for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  const auto t0 = Clock::now();
  const pid_t pid = fork();
  if (pid < 0) die("fork failed");
  if (pid == 0) {
    dup2(2, 1);
    execv(argv[0], argv.data());
    std::perror("execv");
    _exit(127);
  }
  Child c;
  rusage ru{};
  if (wait4(pid, &c.status, 0, &ru) != pid) die("wait4 failed");
  c.seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  c.max_rss_mb = static_cast<double>(ru.ru_maxrss) / 1024.0;  // KiB -> MiB
  return c;
}

std::vector<int> parse_copies(const std::string& s) {
  std::vector<int> v;
  std::size_t at = 0;
  while (at <= s.size()) {
    const std::size_t comma = std::min(s.find(',', at), s.size());
    const int k = std::atoi(s.substr(at, comma - at).c_str());
    if (k <= 0) die("--copies: expected positive counts such as 4,16,64, got '" + s + "'");
    v.push_back(k);
    at = comma + 1;
  }
  return v;
}

// The slope of log(y) on log(x), least squares.
double loglog_slope(const std::vector<double>& x, const std::vector<double>& y) {
  const double n = static_cast<double>(x.size());
  double sx = 0, sy = 0, sxx = 0, sxy = 0;
  for (std::size_t i = 0; i < x.size(); ++i) {
    const double lx = std::log(x[i]), ly = std::log(y[i]);
    sx += lx;
    sy += ly;
    sxx += lx * lx;
    sxy += lx * ly;
  }
  const double d = n * sxx - sx * sx;
  return d == 0 ? std::nan("") : (n * sxy - sx * sy) / d;
}

}  // namespace

int main(int argc, char** argv) {
  fs::path trace, out, dir;
  std::string copies_arg = "4,16,64";
#ifdef WB_BUILT_CLI
  std::string wb = WB_BUILT_CLI;
#else
  std::string wb;
#endif
  bool write_only = false, keep = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto arg = [&]() -> std::string {
      if (i + 1 >= argc) die(a + " needs a value");
      return argv[++i];
    };
    if (a == "--trace") trace = arg();
    else if (a == "--copies") copies_arg = arg();
    else if (a == "--out") out = arg();
    else if (a == "--wb") wb = arg();
    else if (a == "--dir") dir = arg();
    else if (a == "--write-only") write_only = true;
    else if (a == "--keep") keep = true;
    else
      die("unknown argument '" + a +
          "'\nusage: trace_import_scaling --trace FILE.json[.gz] [--copies 4,16,64] [--wb PATH] [--dir DIR] [--keep]\n"
          "       trace_import_scaling --trace FILE.json[.gz] --write-only --copies K --out OUT.json");
  }
  if (trace.empty()) die("--trace FILE.json[.gz] is required (a Kineto trace with ProfilerStep# events)");
  const std::vector<int> copies = parse_copies(copies_arg);

  const auto t0 = Clock::now();
  const Trace tr = load(trace);
  std::int64_t replicated = 0;
  for (const Event& ev : tr.events) replicated += !ev.metadata && ev.ts_ns >= tr.first_step_ns;
  std::printf("trace: %s, %.1f MB, %zu events, %lld ProfilerSteps, span %.3f s; %lld events per copy (read in %.2f s)\n",
              trace.filename().c_str(), static_cast<double>(tr.text.size()) / 1e6, tr.events.size(),
              static_cast<long long>(tr.steps), static_cast<double>(tr.end_ns - tr.start_ns) / 1e9,
              static_cast<long long>(replicated), std::chrono::duration<double>(Clock::now() - t0).count());

  if (write_only) {
    if (out.empty() || copies.size() != 1) die("--write-only needs --copies K (one count) and --out OUT.json");
    std::size_t bytes = 0;
    const std::int64_t events = write_copies(tr, copies[0], out, bytes);
    std::printf("wrote %s: %d copies, %.1f MB, %lld events\n", out.c_str(), copies[0], static_cast<double>(bytes) / 1e6,
                static_cast<long long>(events));
    return 0;
  }
  if (wb.empty() || !fs::exists(wb)) die("the wb binary was not found (pass --wb PATH)");
  const fs::path tmp = dir.empty() ? wb::bench::make_temp_dir("wb-trace-scaling") : dir;
  fs::create_directories(tmp);
  std::printf("wb: %s; files in %s; load average %s\n", wb.c_str(), tmp.c_str(), wb::bench::load_average().c_str());
  std::printf("%8s %10s %12s %10s %14s %14s\n", "copies", "MB", "events", "seconds", "events/s", "peak RSS MB");
  std::vector<double> xs, ys;
  double worst_rate = std::numeric_limits<double>::infinity(), worst_rss = 0, largest_mb = 0, largest_rss = 0;
  for (int k : copies) {
    const fs::path json = tmp / ("trace-x" + std::to_string(k) + ".json");
    const fs::path run = tmp / ("trace-x" + std::to_string(k) + ".sqlite");
    std::size_t bytes = 0;
    const std::int64_t events = write_copies(tr, k, json, bytes);
    const Child c = run_child({wb, "import", "torch-trace", json.string(), "--out", run.string(), "--overwrite", "--quiet"});
    if (!WIFEXITED(c.status) || WEXITSTATUS(c.status) != 0)
      die("wb import failed on " + json.string() + " (status " + std::to_string(c.status) + ")");
    const double rate = static_cast<double>(events) / c.seconds;
    std::printf("%8d %10.1f %12lld %10.2f %14.0f %14.1f\n", k, static_cast<double>(bytes) / 1e6,
                static_cast<long long>(events), c.seconds, rate, c.max_rss_mb);
    std::fflush(stdout);
    xs.push_back(static_cast<double>(events));
    ys.push_back(c.seconds);
    worst_rate = std::min(worst_rate, rate);
    worst_rss = std::max(worst_rss, c.max_rss_mb);
    if (static_cast<double>(bytes) / 1e6 >= largest_mb) {
      largest_mb = static_cast<double>(bytes) / 1e6;
      largest_rss = c.max_rss_mb;
    }
    if (!keep) {
      fs::remove(json);
      fs::remove(run);
    }
  }
  if (!keep && dir.empty()) fs::remove_all(tmp);
  std::printf("slowest %.2fM events/s (goal >= 1M events/s); peak RSS %.0f MB at %.0f MB of JSON (goal <= 1024 MB at 2 GB)\n",
              worst_rate / 1e6, largest_rss, largest_mb);
  if (xs.size() >= 2)
    std::printf("exponent %.2f\n", loglog_slope(xs, ys));
  else
    std::printf("exponent n/a (one length)\n");
  return 0;
}
