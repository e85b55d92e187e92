// The scanner behind read_trace: a cursor over the file's bytes that reads exactly the fields an event
// needs and skips every other value without building it.
#include "ingest/trace_json.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>

namespace wb::ingest {

std::string_view event_cat_name(EventCat c) {
  switch (c) {
    case EventCat::none: return "(none: legacy exporter)";
    case EventCat::cpu_op: return "cpu_op";
    case EventCat::user_annotation: return "user_annotation";
    case EventCat::python_function: return "python_function";
    case EventCat::kernel: return "kernel";
    case EventCat::gpu_memcpy: return "gpu_memcpy";
    case EventCat::gpu_memset: return "gpu_memset";
    case EventCat::cuda_runtime: return "cuda_runtime";
    case EventCat::gpu_user_annotation: return "gpu_user_annotation";
    case EventCat::other: return "other";
  }
  return "?";
}

namespace {

EventCat cat_from(std::string_view s) {
  if (s == "cpu_op" || s == "Operator") return EventCat::cpu_op;
  if (s == "user_annotation") return EventCat::user_annotation;
  if (s == "python_function") return EventCat::python_function;
  if (s == "kernel" || s == "Kernel") return EventCat::kernel;
  if (s == "gpu_memcpy" || s == "Memcpy") return EventCat::gpu_memcpy;
  if (s == "gpu_memset" || s == "Memset") return EventCat::gpu_memset;
  if (s == "cuda_runtime" || s == "cuda_driver" || s == "Runtime") return EventCat::cuda_runtime;
  if (s == "gpu_user_annotation") return EventCat::gpu_user_annotation;
  return EventCat::other;
}

struct StringHash {
  using is_transparent = void;
  std::size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
};

class Scanner {
 public:
  Scanner(std::string_view text, const std::string& file) : b_(text.data()), p_(text.data()), e_(text.data() + text.size()), file_(file) {}

  [[noreturn]] void fail(std::string_view what) const {
    const auto off = static_cast<std::size_t>(p_ - b_);
    if (p_ >= e_)
      throw TraceError(file_ + ": truncated JSON: the file ends at byte " + std::to_string(off) + " inside " +
                       std::string(what) + " (an interrupted export? expected a complete torch.profiler trace)");
    const auto line = static_cast<std::size_t>(std::count(b_, p_, '\n')) + 1;
    std::string found = printable(*p_);
    throw TraceError(file_ + ": not valid JSON at byte " + std::to_string(off) + " (line " + std::to_string(line) +
                     "): expected " + std::string(what) + ", found " + found);
  }

  static std::string printable(char c) {
    if (c >= 0x20 && c < 0x7f) return std::string("'") + c + "'";
    char buf[8];
    std::snprintf(buf, sizeof buf, "0x%02x", static_cast<unsigned char>(c));
    return buf;
  }

  void ws() {
    while (p_ < e_ && (*p_ == ' ' || *p_ == '\n' || *p_ == '\r' || *p_ == '\t')) ++p_;
  }
  bool at_end() {
    ws();
    return p_ >= e_;
  }
  char peek() {
    ws();
    if (p_ >= e_) fail("a value");
    return *p_;
  }
  void expect(char c, std::string_view what) {
    ws();
    if (p_ >= e_ || *p_ != c) fail(what);
    ++p_;
  }
  // After a member or element: true when another follows (a comma was read), false at the closing bracket.
  bool next(char close, std::string_view what) {
    ws();
    if (p_ < e_ && *p_ == ',') {
      ++p_;
      return true;
    }
    if (p_ < e_ && *p_ == close) {
      ++p_;
      return false;
    }
    fail(what);
  }
  bool empty_container(char close) {
    ws();
    if (p_ < e_ && *p_ == close) {
      ++p_;
      return true;
    }
    return false;
  }

  // A string's content: a view into the text when it has no escapes, else decoded into scratch_.
  std::string_view string() {
    expect('"', "a string");
    const char* start = p_;
    const char* q = static_cast<const char*>(std::memchr(p_, '"', static_cast<std::size_t>(e_ - p_)));
    // Fast path: no backslash before the closing quote.
    if (q != nullptr && std::memchr(start, '\\', static_cast<std::size_t>(q - start)) == nullptr) {
      for (const char* c = start; c < q; ++c)
        if (static_cast<unsigned char>(*c) < 0x20) {
          p_ = c;
          fail("a character allowed in a JSON string");
        }
      p_ = q + 1;
      return {start, static_cast<std::size_t>(q - start)};
    }
    scratch_.clear();
    while (true) {
      if (p_ >= e_) fail("a string");
      char c = *p_++;
      if (c == '"') break;
      if (static_cast<unsigned char>(c) < 0x20) {
        --p_;
        fail("a character allowed in a JSON string");
      }
      if (c != '\\') {
        scratch_.push_back(c);
        continue;
      }
      if (p_ >= e_) fail("a string escape");
      char x = *p_++;
      switch (x) {
        case '"': scratch_.push_back('"'); break;
        case '\\': scratch_.push_back('\\'); break;
        case '/': scratch_.push_back('/'); break;
        case 'b': scratch_.push_back('\b'); break;
        case 'f': scratch_.push_back('\f'); break;
        case 'n': scratch_.push_back('\n'); break;
        case 'r': scratch_.push_back('\r'); break;
        case 't': scratch_.push_back('\t'); break;
        case 'u': append_utf8(hex4()); break;
        default: --p_; fail("a string escape (\\\" \\\\ \\/ \\b \\f \\n \\r \\t \\uXXXX)");
      }
    }
    return scratch_;
  }

  // A number's text, checked against JSON's grammar.
  std::string_view number() {
    ws();
    const char* s = p_;
    if (p_ < e_ && *p_ == '-') ++p_;
    if (p_ >= e_ || !digit(*p_)) fail("a number");
    if (*p_ == '0') {
      ++p_;
    } else {
      while (p_ < e_ && digit(*p_)) ++p_;
    }
    if (p_ < e_ && *p_ == '.') {
      ++p_;
      if (p_ >= e_ || !digit(*p_)) fail("a digit after the decimal point");
      while (p_ < e_ && digit(*p_)) ++p_;
    }
    if (p_ < e_ && (*p_ == 'e' || *p_ == 'E')) {
      ++p_;
      if (p_ < e_ && (*p_ == '+' || *p_ == '-')) ++p_;
      if (p_ >= e_ || !digit(*p_)) fail("an exponent");
      while (p_ < e_ && digit(*p_)) ++p_;
    }
    if (p_ >= e_) fail("the end of a number");
    return {s, static_cast<std::size_t>(p_ - s)};
  }

  // Skips any value (checking its syntax) and returns the text it spanned.
  std::string_view skip_value() {
    ws();
    const char* s = p_;
    char c = peek();
    if (c == '{') {
      ++p_;
      if (!empty_container('}')) {
        do {
          string();
          expect(':', "':' after an object key");
          skip_value();
        } while (next('}', "',' or '}' in an object"));
      }
    } else if (c == '[') {
      ++p_;
      if (!empty_container(']')) {
        do skip_value();
        while (next(']', "',' or ']' in an array"));
      }
    } else if (c == '"') {
      string();
    } else if (c == 't') {
      word("true");
    } else if (c == 'f') {
      word("false");
    } else if (c == 'n') {
      word("null");
    } else {
      number();
    }
    return {s, static_cast<std::size_t>(p_ - s)};
  }

  std::size_t offset() const { return static_cast<std::size_t>(p_ - b_); }

 private:
  static bool digit(char c) { return c >= '0' && c <= '9'; }
  void word(std::string_view w) {
    for (char c : w) {
      if (p_ >= e_ || *p_ != c) fail("a JSON value");
      ++p_;
    }
  }
  unsigned hex4() {
    unsigned v = 0;
    for (int i = 0; i < 4; ++i) {
      if (p_ >= e_) fail("four hex digits after \\u");
      char c = *p_++;
      v <<= 4;
      if (c >= '0' && c <= '9') v |= static_cast<unsigned>(c - '0');
      else if (c >= 'a' && c <= 'f') v |= static_cast<unsigned>(c - 'a' + 10);
      else if (c >= 'A' && c <= 'F') v |= static_cast<unsigned>(c - 'A' + 10);
      else {
        --p_;
        fail("four hex digits after \\u");
      }
    }
    return v;
  }
  void append_utf8(unsigned cp) {
    if (cp >= 0xD800 && cp <= 0xDBFF && p_ + 1 < e_ && p_[0] == '\\' && p_[1] == 'u') {
      p_ += 2;
      unsigned lo = hex4();
      cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
    }
    auto put = [&](unsigned x) { scratch_.push_back(static_cast<char>(x)); };
    if (cp < 0x80) put(cp);
    else if (cp < 0x800) { put(0xC0 | (cp >> 6)); put(0x80 | (cp & 0x3F)); }
    else if (cp < 0x10000) { put(0xE0 | (cp >> 12)); put(0x80 | ((cp >> 6) & 0x3F)); put(0x80 | (cp & 0x3F)); }
    else { put(0xF0 | (cp >> 18)); put(0x80 | ((cp >> 12) & 0x3F)); put(0x80 | ((cp >> 6) & 0x3F)); put(0x80 | (cp & 0x3F)); }
  }

  const char* b_;
  const char* p_;
  const char* e_;
  const std::string& file_;
  std::string scratch_;
};

// Microseconds as JSON writes them ("1700000000123.456", "17", "1.5e3") to integer nanoseconds, exactly
// for plain decimals (a double would round Kineto's epoch timestamps); nullopt beyond +-2^62 ns (146
// years), so that the importer's differences and sums of times cannot overflow.
constexpr std::int64_t kTimeLimitNs = std::int64_t{1} << 62;
std::optional<std::int64_t> us_to_ns(std::string_view t) {
  constexpr double kLimitNs = static_cast<double>(kTimeLimitNs);
  bool neg = !t.empty() && t[0] == '-';
  std::size_t i = neg ? 1 : 0;
  if (t.find_first_of("eE") != std::string_view::npos) {
    const double ns = std::strtod(std::string(t).c_str(), nullptr) * 1000.0;
    if (!(std::fabs(ns) < kLimitNs)) return std::nullopt;
    return static_cast<std::int64_t>(std::llround(ns));
  }
  constexpr std::int64_t kMaxWhole = kTimeLimitNs / 1000 - 1;
  std::int64_t whole = 0;
  for (; i < t.size() && t[i] != '.'; ++i) {
    if (whole > (kMaxWhole - 9) / 10) return std::nullopt;
    whole = whole * 10 + (t[i] - '0');
  }
  std::int64_t frac = 0;
  int digits = 0;
  if (i < t.size() && t[i] == '.') {
    for (++i; i < t.size() && digits < 3; ++i, ++digits) frac = frac * 10 + (t[i] - '0');
    for (int d = digits; d < 3; ++d) frac *= 10;
    if (i < t.size() && t[i] >= '5') ++frac;  // round half up on the fourth decimal
  }
  std::int64_t ns = whole * 1000 + frac;
  return neg ? -ns : ns;
}

// An integer field (ids, byte counts, device and stream numbers); -1 (absent) for a value int64 cannot
// hold.
std::int64_t to_int(std::string_view t) {
  std::int64_t v = 0;
  auto [ptr, ec] = std::from_chars(t.data(), t.data() + t.size(), v);
  if (ec != std::errc() || ptr != t.data() + t.size()) {
    double d = std::strtod(std::string(t).c_str(), nullptr);
    return std::fabs(d) < 9.2e18 ? static_cast<std::int64_t>(d) : -1;
  }
  return v;
}

// A real-valued field (blocks per SM, occupancy %); -1 (absent) for one that is not finite.
double to_double(std::string_view t) {
  double d = std::strtod(std::string(t).c_str(), nullptr);
  return std::isfinite(d) ? d : -1.0;
}

class TraceReader {
 public:
  TraceReader(std::string_view text, const std::string& file) : s_(text, file), file_(file) {
    out_.strings.emplace_back();
    ids_.emplace(std::string(), 0);
    out_.events.reserve(text.size() / 200);  // Kineto's events take 150-300 bytes each
  }

  ParsedTrace run() {
    char c = s_.peek();
    if (c == '[') {
      out_.format = TraceFormat::legacy;
      events();
    } else if (c == '{') {
      out_.format = TraceFormat::kineto;
      top_object();
    } else {
      s_.fail("'[' or '{' (a torch.profiler trace is a JSON list of events or an object with traceEvents)");
    }
    if (!s_.at_end()) s_.fail("the end of the file after the trace");
    if (out_.events.empty())
      throw TraceError(file_ + ": the trace holds no events (a profile that recorded nothing? expected ph \"X\" events)");
    return std::move(out_);
  }

 private:
  // "ts" or "dur" in nanoseconds; a value out of range (or a negative timestamp) is an error naming the
  // file.
  std::int64_t time_ns(const char* key) {
    const std::string_view num = s_.number();
    const auto ns = us_to_ns(num);
    if (ns && (*ns >= 0 || std::string_view(key) != "ts")) return *ns;
    throw TraceError(file_ + ": an event's \"" + key + "\" of " + std::string(num.substr(0, 40)) +
                     " us is out of range (expected microseconds from 0 to 4.6e15, as torch.profiler writes them)");
  }

  std::uint32_t intern(std::string_view text) {
    auto it = ids_.find(text);
    if (it != ids_.end()) return it->second;
    auto id = static_cast<std::uint32_t>(out_.strings.size());
    out_.strings.emplace_back(text);
    ids_.emplace(std::string(text), id);
    return id;
  }

  // pid and tid are numbers in Kineto's traces and strings in the legacy exporter's: kept as text.
  std::uint32_t id_value() {
    char c = s_.peek();
    if (c == '"') return intern(s_.string());
    return intern(s_.number());
  }

  void top_object() {
    s_.expect('{', "'{'");
    bool have_events = false;
    if (!s_.empty_container('}')) {
      do {
        std::string key(s_.string());
        s_.expect(':', "':' after an object key");
        if (key == "traceEvents") {
          if (s_.peek() != '[') s_.fail("a list after \"traceEvents\"");
          events();
          have_events = true;
        } else if (key == "deviceProperties" || key == "distributedInfo") {
          std::string_view raw = s_.skip_value();
          auto j = nlohmann::json::parse(raw, nullptr, false);
          if (!j.is_discarded()) (key == "deviceProperties" ? out_.device_properties : out_.distributed_info) = std::move(j);
        } else {
          s_.skip_value();
        }
      } while (s_.next('}', "',' or '}' in the trace object"));
    }
    if (!have_events)
      throw TraceError(file_ + ": JSON, but not a torch.profiler trace: the object has no \"traceEvents\" list");
  }

  void events() {
    s_.expect('[', "'['");
    if (s_.empty_container(']')) return;
    do {
      if (s_.peek() != '{') {
        if (out_.events.empty() && seen_ == 0)
          throw TraceError(file_ + ": JSON, but not a torch.profiler trace: expected a list of event objects, found " +
                           Scanner::printable(s_.peek()) + " at byte " + std::to_string(s_.offset()));
        s_.fail("an event object");
      }
      event();
      ++seen_;
    } while (s_.next(']', "',' or ']' after an event"));
  }

  void event() {
    TraceEvent ev;
    bool have_name = false, have_ph = false, have_ts = false;
    std::string arg_name;  // args.name of metadata events
    s_.expect('{', "'{'");
    if (!s_.empty_container('}')) {
      do {
        std::string_view key = s_.string();
        s_.expect(':', "':' after an object key");
        if (key.size() < 2) {
          s_.skip_value();
          continue;
        }
        switch (key[0]) {
          case 'n':
            if (key == "name") {
              ev.name = intern(s_.string());
              have_name = true;
              continue;
            }
            break;
          case 'p':
            if (key == "ph") {
              std::string_view ph = s_.string();
              ev.ph = ph.empty() ? '?' : ph[0];
              have_ph = true;
              continue;
            }
            if (key == "pid") {
              ev.pid = id_value();
              continue;
            }
            break;
          case 't':
            if (key == "ts") {
              ev.ts_ns = time_ns("ts");
              have_ts = true;
              continue;
            }
            if (key == "tid") {
              ev.tid = id_value();
              continue;
            }
            break;
          case 'd':
            if (key == "dur") {
              ev.dur_ns = time_ns("dur");
              continue;
            }
            break;
          case 'c':
            if (key == "cat") {
              const std::string_view cat = s_.string();
              ev.cat = cat_from(cat);
              if (ev.cat == EventCat::other && out_.other_categories.size() < 64) ++out_.other_categories[std::string(cat)];
              continue;
            }
            break;
          case 'a':
            if (key == "args") {
              if (s_.peek() == '{') {
                args(ev, arg_name);
                continue;
              }
            }
            break;
          default: break;
        }
        s_.skip_value();
      } while (s_.next('}', "',' or '}' in an event"));
    }
    if (!have_name || !have_ph) {
      if (out_.events.empty() && seen_ == 0)
        throw TraceError(file_ + ": JSON, but not a torch.profiler trace: its first event has no \"name\" and \"ph\"");
      return;  // an event without name or phase carries nothing we can place
    }
    if (ev.ph == 'M') {
      std::string_view n = out_.strings[ev.name];
      if (n == "thread_name") out_.thread_names[(std::uint64_t{ev.pid} << 32) | ev.tid] = arg_name;
      if (n == "process_name") out_.process_names[ev.pid] = arg_name;
      if (n == "wb_memory" && ev.mem_total >= 0) out_.max_memory_allocated = ev.mem_total;
      return;
    }
    if ((ev.ph == 'i' || ev.ph == 'I') && have_ts && out_.strings[ev.name] == "[memory]") {
      out_.memory.push_back(TraceMemoryEvent{ev.ts_ns, ev.mem_bytes, ev.mem_total, ev.device_type, ev.pid, ev.tid});
      ++out_.events_by_cat[static_cast<int>(EventCat::other)];
      return;
    }
    if (ev.ph != 'X' || !have_ts) {
      ++out_.events_by_cat[static_cast<int>(EventCat::other)];
      return;  // flows, instants, counters: no duration to place
    }
    ++out_.events_by_cat[static_cast<int>(ev.cat)];
    out_.events.push_back(ev);
  }

  void args(TraceEvent& ev, std::string& arg_name) {
    s_.expect('{', "'{'");
    if (s_.empty_container('}')) return;
    do {
      std::string_view key = s_.string();
      s_.expect(':', "':' after an object key");
      char c = s_.peek();
      if (c == '-' || (c >= '0' && c <= '9')) {
        std::int64_t* slot = nullptr;
        if (key == "External id" || key == "external id") slot = &ev.external_id;
        else if (key == "correlation") slot = &ev.correlation;
        else if (key == "Sequence number") slot = &ev.sequence;
        else if (key == "Fwd thread id") slot = &ev.fwd_tid;
        else if (key == "bytes") slot = &ev.bytes;
        else if (key == "Bytes") slot = &ev.mem_bytes;
        else if (key == "Total Allocated" || key == "max_memory_allocated") slot = &ev.mem_total;
        std::string_view num = s_.number();
        if (slot) *slot = to_int(num);
        else if (key == "device") ev.device = static_cast<std::int32_t>(to_int(num));
        else if (key == "stream") ev.stream = static_cast<std::int32_t>(to_int(num));
        else if (key == "Device Type") ev.device_type = static_cast<std::int32_t>(to_int(num));
        else if (key == "blocks per SM") ev.blocks_per_sm = static_cast<float>(to_double(num));
        else if (key == "est. achieved occupancy %") ev.occupancy = static_cast<float>(to_double(num));
        continue;
      }
      if (c == '[' && (key == "grid" || key == "block")) {
        std::int32_t* dst = key == "grid" ? ev.grid : ev.block;
        s_.expect('[', "'['");
        int i = 0;
        if (!s_.empty_container(']')) {
          do {
            if (s_.peek() == '"' || s_.peek() == '[' || s_.peek() == '{') {
              s_.skip_value();
            } else {
              std::string_view num = s_.number();
              if (i < 3) dst[i] = static_cast<std::int32_t>(to_int(num));
            }
            ++i;
          } while (s_.next(']', "',' or ']' in an array"));
        }
        continue;
      }
      if (c == '"' && key == "name") {
        arg_name = std::string(s_.string());
        continue;
      }
      s_.skip_value();
    } while (s_.next('}', "',' or '}' in args"));
  }

  Scanner s_;
  const std::string& file_;
  ParsedTrace out_;
  std::unordered_map<std::string, std::uint32_t, StringHash, std::equal_to<>> ids_;
  std::int64_t seen_ = 0;
};

}  // namespace

ParsedTrace parse_trace(std::string_view text, const std::string& file) {
  if (text.empty()) throw TraceError(file + ": empty file (expected a torch.profiler trace, JSON)");
  return TraceReader(text, file).run();
}

namespace {

std::string gunzip(std::string_view data, const std::string& file) {
  z_stream z{};
  if (inflateInit2(&z, 16 + MAX_WBITS) != Z_OK) throw TraceError(file + ": cannot start gzip decompression");
  std::string out;
  out.resize(std::max<std::size_t>(data.size() * 4, 1 << 16));
  z.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(data.data()));
  z.avail_in = static_cast<uInt>(data.size());
  int rc = Z_OK;
  while (true) {
    if (z.total_out >= out.size()) out.resize(out.size() * 2);
    z.next_out = reinterpret_cast<Bytef*>(out.data() + z.total_out);
    z.avail_out = static_cast<uInt>(std::min<std::size_t>(out.size() - z.total_out, 1u << 30));
    rc = inflate(&z, Z_NO_FLUSH);
    if (rc == Z_STREAM_END) break;
    if (rc == Z_BUF_ERROR && z.avail_in == 0) {
      inflateEnd(&z);
      throw TraceError(file + ": truncated gzip data (expected a complete .json.gz trace)");
    }
    if (rc != Z_OK && rc != Z_BUF_ERROR) {
      inflateEnd(&z);
      throw TraceError(file + ": corrupt gzip data (" + std::string(z.msg ? z.msg : "inflate failed") + ")");
    }
  }
  out.resize(z.total_out);
  inflateEnd(&z);
  return out;
}

}  // namespace

ParsedTrace read_trace(const std::filesystem::path& path) {
  const std::string file = path.string();
  // Mapped, not read: a trace of a few hundred MB is scanned once, front to back.
  int fd = ::open(file.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw TraceError(file + ": cannot open (expected a torch.profiler trace, .json or .json.gz)");
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    throw TraceError(file + ": not a regular file (expected a torch.profiler trace, .json or .json.gz)");
  }
  const auto size = static_cast<std::size_t>(st.st_size);
  if (size == 0) {
    ::close(fd);
    return parse_trace({}, file);
  }
  void* map = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
  ::close(fd);
  if (map == MAP_FAILED) throw TraceError(file + ": cannot map the file into memory");
  ::madvise(map, size, MADV_SEQUENTIAL);
  struct Unmap {
    void* p;
    std::size_t n;
    ~Unmap() { ::munmap(p, n); }
  } unmap{map, size};
  std::string_view text(static_cast<const char*>(map), size);
  if (size >= 2 && static_cast<unsigned char>(text[0]) == 0x1f && static_cast<unsigned char>(text[1]) == 0x8b) {
    std::string inflated = gunzip(text, file);
    return parse_trace(inflated, file);
  }
  return parse_trace(text, file);
}

}  // namespace wb::ingest
