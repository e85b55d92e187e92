// The scanner behind read_trace: a cursor over the file's bytes that reads exactly the fields an event
// needs and skips every other value without building it.
#include "ingest/trace_json.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>
#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <optional>
#include <thread>

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

// Where a Scanner's bytes come from when they are not all in memory: a file read in chunks, or the
// text inflated from a .json.gz as it is read.
class Source {
 public:
  virtual ~Source() = default;
  // Up to `n` bytes into `dst`; 0 only at the end. Throws TraceError (a read error, corrupt gzip data).
  virtual std::size_t read(char* dst, std::size_t n) = 0;
  // The same bytes again from the start, for an error message's line number; null when they cannot be.
  virtual std::unique_ptr<Source> reopen() const = 0;
};

// A cursor over the text, held either whole (parse_trace) or as a window that slides over a Source
// (read_trace): when the cursor reaches the window's end, more() moves the bytes still needed to the
// buffer's front and appends the next chunk. The bytes still needed are those from the cursor (which
// stays on a string's or number's first byte until it is read whole) and from the pin (raw_value's
// start). The window grows only when those bytes fill half of it (a string or a raw value longer than
// that), so that each slide reads at least half a window: linear time. A view the scanner returns stays
// valid until its next call (the window may move then): a reader names a key (an enum) before it reads on.
class Scanner {
 public:
  static constexpr std::size_t kNone = static_cast<std::size_t>(-1);
  static constexpr std::size_t kChunk = std::size_t{8} << 20;

  Scanner(std::string_view text, const std::string& file)
      : buf_(text.data()), p_(text.data()), e_(text.data() + text.size()), file_(file) {}
  Scanner(Source& src, const std::string& file) : src_(&src), file_(file) {
    cap_ = kChunk;
    owned_.reset(new char[cap_]);
    buf_ = p_ = e_ = owned_.get();
    more();
  }

  // Whether the text holds no byte at all (checked before anything is read).
  bool empty() const { return base_ == 0 && e_ == buf_; }

  [[noreturn]] void fail(std::string_view what) const {
    const auto off = offset();
    if (p_ >= e_)
      throw TraceError(file_ + ": truncated JSON: the file ends at byte " + std::to_string(off) + " inside " +
                       std::string(what) + " (an interrupted export? expected a complete torch.profiler trace)");
    const std::string line = line_at();
    std::string found = printable(*p_);
    throw TraceError(file_ + ": not valid JSON at byte " + std::to_string(off) + " (line " + line +
                     "): expected " + std::string(what) + ", found " + found);
  }

  static std::string printable(char c) {
    if (c >= 0x20 && c < 0x7f) return std::string("'") + c + "'";
    char buf[8];
    std::snprintf(buf, sizeof buf, "0x%02x", static_cast<unsigned char>(c));
    return buf;
  }

  void ws() {
    while (p_ < e_ && space(*p_)) ++p_;
    if (p_ >= e_) [[unlikely]] ws_on();
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

  // Keeps the text from the cursor on in the window (see the class comment); returns the pin it replaces,
  // for unpin.
  std::size_t pin() {
    const std::size_t old = pin_;
    pin_ = offset();
    return old;
  }
  void unpin(std::size_t old) { pin_ = old; }

  // A string's content: a view into the text when it has no escapes, else decoded into scratch_; valid
  // until the next call of the scanner.
  std::string_view string() {
    expect('"', "a string");
    // Fast path: the closing quote with no backslash before it. The cursor stays on the string's first
    // byte while the window slides, so that the bytes searched are kept.
    const char* q = nullptr;
    std::size_t searched = 0;
    while ((q = string_stop(p_ + searched)) == e_) {
      searched = static_cast<std::size_t>(e_ - p_);
      if (!more()) {
        p_ = e_;
        fail("a string");
      }
    }
    if (*q == '"') {
      const char* start = p_;
      p_ = q + 1;
      return {start, static_cast<std::size_t>(q - start)};
    }
    if (*q != '\\') {
      p_ = q;
      fail("a character allowed in a JSON string");
    }
    // An escape: decoded from there on.
    scratch_.assign(p_, q);
    p_ = q;
    while (true) {
      if (!has()) fail("a string");
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
      if (!has()) fail("a string escape");
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

  // A number's text, checked against JSON's grammar; valid until the next call of the scanner.
  std::string_view number() {
    ws();
    const char* what = nullptr;
    const char* end = nullptr;
    // A number that runs to the window's end is read again from its start once the window has slid (the
    // cursor stays on its first byte, so that it is kept).
    while ((end = number_end(p_, what)) == nullptr) {
      if (!more()) {
        p_ = e_;
        fail(what);
      }
    }
    const char* s = p_;
    p_ = end;
    return {s, static_cast<std::size_t>(end - s)};
  }

  // Skips any value, checking its syntax.
  void skip_value() {
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
  }

  // Skips any value and returns the text it spanned (valid until the next call of the scanner).
  std::string_view raw_value() {
    ws();
    const std::size_t old = pin();
    const std::size_t start = pin_;
    skip_value();
    unpin(old);
    const char* s = buf_ + (start - base_);
    return {s, static_cast<std::size_t>(p_ - s)};
  }

  std::size_t offset() const { return base_ + static_cast<std::size_t>(p_ - buf_); }

  // JSON's whitespace.
  static bool space(char c) { return c == ' ' || c == '\n' || c == '\r' || c == '\t'; }

 private:
  static bool digit(char c) { return c >= '0' && c <= '9'; }

  // The first byte from q on that ends a string's plain run: '"', '\\' or a control character (not
  // allowed in a JSON string); e_ when there is none. Sixteen bytes at a time where SSE2 is.
  const char* string_stop(const char* q) const {
#if defined(__SSE2__)
    const __m128i quote = _mm_set1_epi8('"'), backslash = _mm_set1_epi8('\\'), control = _mm_set1_epi8(0x1f);
    while (e_ - q >= 16) {
      const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(q));
      const __m128i stop = _mm_or_si128(_mm_or_si128(_mm_cmpeq_epi8(v, quote), _mm_cmpeq_epi8(v, backslash)),
                                        _mm_cmpeq_epi8(_mm_max_epu8(v, control), control));  // v <= 0x1f unsigned
      if (const int bits = _mm_movemask_epi8(stop)) return q + __builtin_ctz(static_cast<unsigned>(bits));
      q += 16;
    }
#endif
    while (q < e_ && *q != '"' && *q != '\\' && static_cast<unsigned char>(*q) >= 0x20) ++q;
    return q;
  }

  // The rest of ws() when it reaches the window's end.
  [[gnu::noinline]] void ws_on() {
    while (more()) {
      while (p_ < e_ && space(*p_)) ++p_;
      if (p_ < e_) return;
    }
  }

  // The end of the number at q, checked against JSON's grammar, when it ends before the window does;
  // null when it runs to the window's end, with `what` it expects there (the error at the text's end).
  const char* number_end(const char* q, const char*& what) {
    if (q < e_ && *q == '-') ++q;
    what = "a number";
    if (q >= e_) return nullptr;
    if (!digit(*q)) {
      p_ = q;
      fail(what);
    }
    if (*q == '0') {
      ++q;
    } else {
      while (q < e_ && digit(*q)) ++q;
    }
    what = "the end of a number";
    if (q >= e_) return nullptr;
    // One or more digits (a fraction's, an exponent's), `expected` naming them; false when the window
    // ends before the number does.
    auto digits = [&](const char* expected) {
      what = expected;
      if (q >= e_) return false;
      if (!digit(*q)) {
        p_ = q;
        fail(what);
      }
      while (q < e_ && digit(*q)) ++q;
      what = "the end of a number";
      return q < e_;
    };
    if (*q == '.') {
      ++q;
      if (!digits("a digit after the decimal point")) return nullptr;
    }
    if (*q == 'e' || *q == 'E') {
      ++q;
      if (q < e_ && (*q == '+' || *q == '-')) ++q;
      if (!digits("an exponent")) return nullptr;
    }
    return q;
  }

  // Whether a byte is at the cursor, reading the next chunk when the window is used up.
  bool has() { return p_ < e_ || more(); }
  // Whether `n` bytes are at the cursor, reading on as needed.
  bool ensure(std::size_t n) {
    while (static_cast<std::size_t>(e_ - p_) < n)
      if (!more()) return false;
    return true;
  }

  // Slides the window: keeps the bytes from the cursor and the pin, and appends the next chunk.
  // False at the end of the text (nothing was appended).
  [[gnu::noinline]] bool more() {
    if (src_ == nullptr || eof_) return false;
    std::size_t keep = offset();
    if (pin_ < keep) keep = pin_;
    const char* from = buf_ + (keep - base_);
    const auto kept = static_cast<std::size_t>(e_ - from);
    const auto at = static_cast<std::size_t>(p_ - from);
    char* dst = owned_.get();
    if (kept > cap_ / 2) {
      cap_ = std::max(cap_ * 2, kept + kChunk);
      std::unique_ptr<char[]> bigger(new char[cap_]);
      std::memcpy(bigger.get(), from, kept);
      owned_ = std::move(bigger);
      dst = owned_.get();
    } else if (from != dst) {
      std::memmove(dst, from, kept);
    }
    buf_ = dst;
    base_ = keep;
    p_ = dst + at;
    const std::size_t got = src_->read(dst + kept, cap_ - kept);
    e_ = dst + kept + got;
    if (got == 0) eof_ = true;
    return got > 0;
  }

  // The line of the cursor, counting the newlines the window has slid past by reading the text again.
  std::string line_at() const {
    std::size_t lines = static_cast<std::size_t>(std::count(buf_, p_, '\n')) + 1;
    if (base_ > 0) {
      try {
        std::unique_ptr<Source> again = src_ ? src_->reopen() : nullptr;
        if (!again) return "?";
        std::unique_ptr<char[]> chunk(new char[kChunk]);
        for (std::size_t left = base_; left > 0;) {
          const std::size_t n = again->read(chunk.get(), std::min(left, kChunk));
          if (n == 0) return "?";
          lines += static_cast<std::size_t>(std::count(chunk.get(), chunk.get() + n, '\n'));
          left -= n;
        }
      } catch (const std::exception&) {
        return "?";
      }
    }
    return std::to_string(lines);
  }

  void word(std::string_view w) {
    for (char c : w) {
      if (!has() || *p_ != c) fail("a JSON value");
      ++p_;
    }
  }
  unsigned hex4() {
    unsigned v = 0;
    for (int i = 0; i < 4; ++i) {
      if (!has()) fail("four hex digits after \\u");
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
    if (cp >= 0xD800 && cp <= 0xDBFF && ensure(2) && p_[0] == '\\' && p_[1] == 'u') {
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

  Source* src_ = nullptr;           // null: the whole text is in [buf_, e_)
  std::unique_ptr<char[]> owned_;   // the window's buffer, when reading a Source
  std::size_t cap_ = 0;
  bool eof_ = false;
  const char* buf_;                 // the window's first byte ...
  std::size_t base_ = 0;            // ... is the text's byte base_
  const char* p_;
  const char* e_;
  std::size_t pin_ = kNone;         // the text from here on is kept when the window slides
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
  if (std::any_of(t.begin(), t.end(), [](char c) { return c == 'e' || c == 'E'; })) {
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
  TraceReader(Scanner& s, const std::string& file) : s_(s), file_(file) {
    out_.strings.emplace_back();
    ids_.emplace(std::string(), 0);
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
    if (stopped_) return ParsedTrace{};  // a second reader has the rest: absorb() it, then finish()
    if (!s_.at_end()) s_.fail("the end of the file after the trace");
    return finish();
  }

  // Stops before the event of traceEvents that starts at byte `at`, if one does (stopped() then says so),
  // for a second reader that parses the rest from there (run_from_event). Passing `at` inside another
  // value (the byte was no event's start) drops the stop, and this reader reads on to the end.
  void stop_at(std::size_t at) { stop_at_ = at; }
  bool stopped() const { return stopped_; }

  // The rest of a trace from one of traceEvents' events on: the scanner starts on its '{'. The events to
  // the list's end, then (Kineto) the trace object's other members.
  ParsedTrace run_from_event(TraceFormat format) {
    out_.format = format;
    seen_ = 1;  // not the trace's first event: no diagnosis of what the file is
    do {
      if (s_.peek() != '{') s_.fail("an event object");
      event();
      ++seen_;
    } while (s_.next(']', "',' or ']' after an event"));
    bool have_events = true;
    if (format == TraceFormat::kineto)
      while (s_.next('}', "',' or '}' in the trace object")) top_member(have_events);
    if (!s_.at_end()) s_.fail("the end of the file after the trace");
    return std::move(out_);
  }

  // The trace, once a stopped reader has absorbed the rest.
  ParsedTrace finish() {
    if (out_.events.empty())
      throw TraceError(file_ +
                       ": the trace holds no events (a profile that recorded nothing? expected ph \"X\" events)");
    return std::move(out_);
  }

  // Adds what a second reader parsed from this one's stop on: its events after these, its strings
  // interned here (their ids renumbered), its names and memory events, and the members it read.
  void absorb(ParsedTrace&& b) {
    std::vector<std::uint32_t> id(b.strings.size());
    for (std::size_t i = 0; i < b.strings.size(); ++i) id[i] = intern(b.strings[i]);
    b.events.consume([&](const TraceEvent& e) {
      TraceEvent r = e;
      r.name = id[e.name];
      r.pid = id[e.pid];
      r.tid = id[e.tid];
      out_.events.push_back(r);
    });
    for (int c = 0; c < kEventCats; ++c) out_.events_by_cat[c] += b.events_by_cat[c];
    for (const auto& [key, name] : b.thread_names)
      out_.thread_names[(std::uint64_t{id[key >> 32]} << 32) | id[key & 0xFFFFFFFFu]] = name;
    for (const auto& [pid, name] : b.process_names) out_.process_names[id[pid]] = name;
    for (TraceMemoryEvent m : b.memory) {
      m.pid = id[m.pid];
      m.tid = id[m.tid];
      out_.memory.push_back(m);
    }
    for (const auto& [cat, n] : b.other_categories)
      if (out_.other_categories.size() < 64 || out_.other_categories.count(cat)) out_.other_categories[cat] += n;
    if (!b.device_properties.empty()) out_.device_properties = std::move(b.device_properties);
    if (!b.distributed_info.empty()) out_.distributed_info = std::move(b.distributed_info);
    if (b.max_memory_allocated >= 0) out_.max_memory_allocated = b.max_memory_allocated;
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
        top_member(have_events);
        if (stopped_) return;
      } while (s_.next('}', "',' or '}' in the trace object"));
    }
    if (!have_events)
      throw TraceError(file_ + ": JSON, but not a torch.profiler trace: the object has no \"traceEvents\" list");
  }

  // One member of the trace object: its key and value.
  void top_member(bool& have_events) {
    std::string key(s_.string());
    s_.expect(':', "':' after an object key");
    if (key == "traceEvents") {
      if (s_.peek() != '[') s_.fail("a list after \"traceEvents\"");
      events();
      have_events = true;
    } else if (key == "deviceProperties" || key == "distributedInfo") {
      std::string_view raw = s_.raw_value();
      auto j = nlohmann::json::parse(raw, nullptr, false);
      if (!j.is_discarded())
        (key == "deviceProperties" ? out_.device_properties : out_.distributed_info) = std::move(j);
    } else {
      s_.skip_value();
    }
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
      if (s_.offset() >= stop_at_) [[unlikely]] {
        if (s_.offset() == stop_at_) {
          stopped_ = true;
          return;
        }
        stop_at_ = Scanner::kNone;
      }
      event();
      ++seen_;
    } while (s_.next(']', "',' or ']' after an event"));
  }

  // An event's members this reader reads, named before the window may slide (their key's view ends then).
  enum class Member : std::uint8_t { other, name, ph, pid, ts, tid, dur, cat, args };
  static Member member(std::string_view key) {
    if (key.size() < 2) return Member::other;
    switch (key[0]) {
      case 'n': return key == "name" ? Member::name : Member::other;
      case 'p': return key == "ph" ? Member::ph : key == "pid" ? Member::pid : Member::other;
      case 't': return key == "ts" ? Member::ts : key == "tid" ? Member::tid : Member::other;
      case 'd': return key == "dur" ? Member::dur : Member::other;
      case 'c': return key == "cat" ? Member::cat : Member::other;
      case 'a': return key == "args" ? Member::args : Member::other;
      default: return Member::other;
    }
  }

  // What only memory and metadata events carry, read beside the event.
  struct Extras {
    std::string name;             // args["name"] of metadata events
    std::int64_t mem_bytes = 0;   // args["Bytes"] of memory events
    std::int64_t mem_total = -1;  // args["Total Allocated"] of memory events, args["max_memory_allocated"] of wb_memory
    std::int32_t device_type = 0; // args["Device Type"] of memory events
  };

  void event() {
    TraceEvent ev;
    Extras extras;
    bool have_name = false, have_ph = false, have_ts = false;
    s_.expect('{', "'{'");
    if (!s_.empty_container('}')) {
      do {
        const Member m = member(s_.string());
        s_.expect(':', "':' after an object key");
        switch (m) {
          case Member::name:
            ev.name = intern(s_.string());
            have_name = true;
            continue;
          case Member::ph: {
            std::string_view ph = s_.string();
            ev.ph = ph.empty() ? '?' : ph[0];
            have_ph = true;
            continue;
          }
          case Member::pid: ev.pid = id_value(); continue;
          case Member::ts:
            ev.ts_ns = time_ns("ts");
            have_ts = true;
            continue;
          case Member::tid: ev.tid = id_value(); continue;
          case Member::dur: ev.dur_ns = time_ns("dur"); continue;
          case Member::cat: {
            const std::string_view cat = s_.string();
            ev.cat = cat_from(cat);
            if (ev.cat == EventCat::other && out_.other_categories.size() < 64) ++out_.other_categories[std::string(cat)];
            continue;
          }
          case Member::args:
            if (s_.peek() == '{') {
              args(ev, extras);
              continue;
            }
            break;
          case Member::other: break;
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
      if (n == "thread_name") out_.thread_names[(std::uint64_t{ev.pid} << 32) | ev.tid] = extras.name;
      if (n == "process_name") out_.process_names[ev.pid] = extras.name;
      if (n == "wb_memory" && extras.mem_total >= 0) out_.max_memory_allocated = extras.mem_total;
      return;
    }
    if ((ev.ph == 'i' || ev.ph == 'I') && have_ts && out_.strings[ev.name] == "[memory]") {
      out_.memory.push_back(
          TraceMemoryEvent{ev.ts_ns, extras.mem_bytes, extras.mem_total, extras.device_type, ev.pid, ev.tid});
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

  // The args this reader reads, named as the event's members are.
  enum class Arg : std::uint8_t {
    other, external_id, correlation, sequence, fwd_tid, bytes, mem_bytes, mem_total, device, stream, device_type,
    blocks_per_sm, occupancy, grid, block, name
  };
  static Arg arg(std::string_view key) {
    switch (key.size()) {
      case 4: return key == "grid" ? Arg::grid : key == "name" ? Arg::name : Arg::other;
      case 5: return key == "bytes" ? Arg::bytes : key == "Bytes" ? Arg::mem_bytes : key == "block" ? Arg::block : Arg::other;
      case 6: return key == "device" ? Arg::device : key == "stream" ? Arg::stream : Arg::other;
      case 11:
        return key == "External id" || key == "external id" ? Arg::external_id
               : key == "correlation"                     ? Arg::correlation
               : key == "Device Type"                     ? Arg::device_type
                                                          : Arg::other;
      case 13: return key == "Fwd thread id" ? Arg::fwd_tid : key == "blocks per SM" ? Arg::blocks_per_sm : Arg::other;
      case 15: return key == "Sequence number" ? Arg::sequence : key == "Total Allocated" ? Arg::mem_total : Arg::other;
      case 20: return key == "max_memory_allocated" ? Arg::mem_total : Arg::other;
      case 25: return key == "est. achieved occupancy %" ? Arg::occupancy : Arg::other;
      default: return Arg::other;
    }
  }

  void args(TraceEvent& ev, Extras& extras) {
    s_.expect('{', "'{'");
    if (s_.empty_container('}')) return;
    do {
      const Arg a = arg(s_.string());
      s_.expect(':', "':' after an object key");
      char c = s_.peek();
      if (c == '-' || (c >= '0' && c <= '9')) {
        std::string_view num = s_.number();
        switch (a) {
          case Arg::external_id: ev.external_id = to_int(num); break;
          case Arg::correlation: ev.correlation = to_int(num); break;
          case Arg::sequence: ev.sequence = to_int(num); break;
          case Arg::fwd_tid: ev.fwd_tid = to_int(num); break;
          case Arg::bytes: ev.bytes = to_int(num); break;
          case Arg::mem_bytes: extras.mem_bytes = to_int(num); break;
          case Arg::mem_total: extras.mem_total = to_int(num); break;
          case Arg::device: ev.device = static_cast<std::int32_t>(to_int(num)); break;
          case Arg::stream: ev.stream = static_cast<std::int32_t>(to_int(num)); break;
          case Arg::device_type: extras.device_type = static_cast<std::int32_t>(to_int(num)); break;
          case Arg::blocks_per_sm: ev.blocks_per_sm = static_cast<float>(to_double(num)); break;
          case Arg::occupancy: ev.occupancy = static_cast<float>(to_double(num)); break;
          default: break;
        }
        continue;
      }
      if (c == '[' && (a == Arg::grid || a == Arg::block)) {
        std::int32_t* dst = a == Arg::grid ? ev.grid : ev.block;
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
      if (c == '"' && a == Arg::name) {
        extras.name = std::string(s_.string());
        continue;
      }
      s_.skip_value();
    } while (s_.next('}', "',' or '}' in args"));
  }

  Scanner& s_;
  const std::string& file_;
  ParsedTrace out_;
  std::unordered_map<std::string, std::uint32_t, StringHash, std::equal_to<>> ids_;
  std::int64_t seen_ = 0;
  std::size_t stop_at_ = Scanner::kNone;
  bool stopped_ = false;
};

}  // namespace

ParsedTrace parse_trace(std::string_view text, const std::string& file) {
  if (text.empty()) throw TraceError(file + ": empty file (expected a torch.profiler trace, JSON)");
  Scanner s(text, file);
  return TraceReader(s, file).run();
}

namespace {

constexpr std::size_t kReadChunk = std::size_t{1} << 20;  // compressed bytes per read of a .json.gz

// An open file descriptor, closed on destruction.
struct Fd {
  int fd = -1;
  explicit Fd(int f) : fd(f) {}
  Fd(Fd&& o) noexcept : fd(o.fd) { o.fd = -1; }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
};

// Opens a trace for reading; the size of the regular file it must be.
Fd open_trace(const std::string& file, std::size_t& size) {
  Fd fd(::open(file.c_str(), O_RDONLY | O_CLOEXEC));
  if (fd.fd < 0) throw TraceError(file + ": cannot open (expected a torch.profiler trace, .json or .json.gz)");
  struct stat st {};
  if (::fstat(fd.fd, &st) != 0 || !S_ISREG(st.st_mode))
    throw TraceError(file + ": not a regular file (expected a torch.profiler trace, .json or .json.gz)");
  size = static_cast<std::size_t>(st.st_size);
  ::posix_fadvise(fd.fd, 0, 0, POSIX_FADV_SEQUENTIAL);
  return fd;
}

// Up to `n` bytes of the file; fewer only at its end.
std::size_t read_full(int fd, char* dst, std::size_t n, const std::string& file) {
  std::size_t got = 0;
  while (got < n) {
    const ssize_t r = ::read(fd, dst + got, n - got);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) throw TraceError(file + ": cannot read (" + std::strerror(errno) + ")");
    if (r == 0) break;
    got += static_cast<std::size_t>(r);
  }
  return got;
}

// A plain .json file, read in the chunks the scanner asks for.
class FileSource final : public Source {
 public:
  // From byte `from` of the file on.
  explicit FileSource(const std::string& file, std::size_t from = 0) : file_(file), fd_(open_trace(file, size_)) {
    if (from > 0 && ::lseek(fd_.fd, static_cast<off_t>(from), SEEK_SET) < 0)
      throw TraceError(file + ": cannot seek (" + std::strerror(errno) + ")");
  }
  std::size_t size() const { return size_; }
  std::size_t read(char* dst, std::size_t n) override { return read_full(fd_.fd, dst, n, file_); }
  std::unique_ptr<Source> reopen() const override { return std::make_unique<FileSource>(file_); }

 private:
  std::string file_;
  std::size_t size_ = 0;
  Fd fd_;
};

// A .json.gz (one gzip member, as tensorboard_trace_handler writes), inflated as the scanner reads it.
class GzipSource final : public Source {
 public:
  explicit GzipSource(const std::string& file) : file_(file), fd_(open_trace(file, size_)), in_(new char[kReadChunk]) {
    if (inflateInit2(&z_, 16 + MAX_WBITS) != Z_OK) throw TraceError(file + ": cannot start gzip decompression");
  }
  GzipSource(const GzipSource&) = delete;
  GzipSource& operator=(const GzipSource&) = delete;
  ~GzipSource() override { inflateEnd(&z_); }

  std::size_t read(char* dst, std::size_t n) override {
    if (done_ || failed_) return 0;
    z_.next_out = reinterpret_cast<Bytef*>(dst);
    z_.avail_out = static_cast<uInt>(std::min<std::size_t>(n, 1u << 30));
    const uInt want = z_.avail_out;
    while (z_.avail_out > 0) {
      if (z_.avail_in == 0 && !in_eof_) {
        const std::size_t got = read_full(fd_.fd, in_.get(), kReadChunk, file_);
        if (got == 0) in_eof_ = true;
        z_.next_in = reinterpret_cast<Bytef*>(in_.get());
        z_.avail_in = static_cast<uInt>(got);
      }
      const int rc = inflate(&z_, Z_NO_FLUSH);
      if (rc == Z_STREAM_END) {
        done_ = true;
        break;
      }
      if (rc == Z_BUF_ERROR && z_.avail_in == 0 && in_eof_) {
        failed_ = true;
        throw TraceError(file_ + ": truncated gzip data (expected a complete .json.gz trace)");
      }
      if (rc != Z_OK && rc != Z_BUF_ERROR) {
        failed_ = true;
        throw TraceError(file_ + ": corrupt gzip data (" + std::string(z_.msg ? z_.msg : "inflate failed") + ")");
      }
    }
    return want - z_.avail_out;
  }
  std::unique_ptr<Source> reopen() const override { return std::make_unique<GzipSource>(file_); }

  // Inflates the rest, throwing the truncated or corrupt data's error if there is one: a damaged .json.gz
  // is reported as such, as when it was inflated whole before the scan, not by the JSON it inflated to
  // before the damage was found (a flipped bit shows at the end, in the checksum).
  void check_rest() {
    std::unique_ptr<char[]> sink(new char[kReadChunk]);
    while (read(sink.get(), kReadChunk) > 0) {
    }
  }

 private:
  std::string file_;
  std::size_t size_ = 0;
  Fd fd_;
  std::unique_ptr<char[]> in_;
  z_stream z_{};
  bool in_eof_ = false;
  bool done_ = false;
  bool failed_ = false;
};

// Whether the file starts with gzip's magic bytes (the name's suffix is not trusted).
bool is_gzip(const std::string& file) {
  std::size_t size = 0;
  Fd fd = open_trace(file, size);
  unsigned char magic[2] = {};
  return size >= 2 && ::pread(fd.fd, magic, 2, 0) == 2 && magic[0] == 0x1f && magic[1] == 0x8b;
}

// A plain file at least this large is parsed by two threads, each half of it.
constexpr std::size_t kSplitBytes = std::size_t{32} << 20;

// Where the second half's reader starts and the trace's format; nullopt when the file offers no start.
struct SplitPlan {
  std::size_t at = 0;  // the '{' of the first "}, {" (blanks allowed around the comma) at the middle
  TraceFormat format = TraceFormat::kineto;  // from the first byte that is not blank: '[' legacy, '{' Kineto
};

// The start is only a candidate: the bytes may be inside a string or a nested value. The first reader
// confirms it by reaching an event of traceEvents that starts there. A file whose first 4 KB are blank
// is left to the serial parse.
std::optional<SplitPlan> split_plan(const std::string& file, std::size_t size) {
  constexpr std::size_t kWindow = std::size_t{1} << 20, kHead = 4096;
  std::size_t ignored = 0;
  Fd fd = open_trace(file, ignored);
  std::string w(kWindow, '\0');
  const ssize_t head = ::pread(fd.fd, w.data(), kHead, 0);
  if (head <= 0) return std::nullopt;
  const auto first = std::find_if_not(w.data(), w.data() + head, Scanner::space);
  if (first == w.data() + head) return std::nullopt;
  SplitPlan plan;
  plan.format = *first == '[' ? TraceFormat::legacy : TraceFormat::kineto;
  const std::size_t at = size / 2;
  const ssize_t got = ::pread(fd.fd, w.data(), kWindow, static_cast<off_t>(at));
  if (got <= 0) return std::nullopt;
  w.resize(static_cast<std::size_t>(got));
  for (std::size_t i = w.find('}'); i != std::string::npos; i = w.find('}', i + 1)) {
    std::size_t j = i + 1;
    while (j < w.size() && Scanner::space(w[j])) ++j;
    if (j >= w.size() || w[j] != ',') continue;
    ++j;
    while (j < w.size() && Scanner::space(w[j])) ++j;
    if (j < w.size() && w[j] == '{') {
      plan.at = at + j;
      return plan;
    }
  }
  return std::nullopt;
}

// A plain trace in two halves at once: the first reader from the start up to the candidate event, the
// second from that event to the end; the second's events follow the first's. When the first reader did
// not stop at the candidate, it read the whole file alone. When either failed, one reader reads it again
// (nullopt): the result and every error are those of the serial parse.
std::optional<ParsedTrace> read_halves(const std::string& file, std::size_t size) {
  const std::optional<SplitPlan> plan = split_plan(file, size);
  if (!plan) return std::nullopt;
  const std::size_t at = plan->at;
  const TraceFormat format = plan->format;
  std::optional<ParsedTrace> second;
  std::thread worker([&] {
    try {
      FileSource src(file, at);
      Scanner s(src, file);
      second = TraceReader(s, file).run_from_event(format);
    } catch (const std::exception&) {
      second.reset();  // the serial parse reports it, with the byte and line of the whole file
    }
  });
  std::optional<ParsedTrace> whole;
  try {
    FileSource src(file);
    Scanner s(src, file);
    TraceReader first(s, file);
    first.stop_at(at);
    ParsedTrace part = first.run();
    worker.join();
    if (!first.stopped()) return part;  // the candidate was inside a value: this reader read it all
    if (!second) return std::nullopt;
    first.absorb(std::move(*second));
    second.reset();
    whole = first.finish();
    whole->readers = 2;
  } catch (const std::exception&) {
    if (worker.joinable()) worker.join();
    return std::nullopt;
  }
  return whole;
}

}  // namespace

ParsedTrace read_trace(const std::filesystem::path& path) {
  const std::string file = path.string();
  // Streamed: the scanner holds a window of a few MB of the text, never the whole (plain or inflated).
  if (!is_gzip(file)) {
    FileSource src(file);
    if (src.size() >= kSplitBytes) {
      if (auto halves = read_halves(file, src.size())) return std::move(*halves);
    }
    Scanner s(src, file);
    if (s.empty()) throw TraceError(file + ": empty file (expected a torch.profiler trace, JSON)");
    return TraceReader(s, file).run();
  }
  GzipSource src(file);
  try {
    Scanner s(src, file);
    if (s.empty()) throw TraceError(file + ": empty file (expected a torch.profiler trace, JSON)");
    return TraceReader(s, file).run();
  } catch (const TraceError&) {
    src.check_rest();
    throw;
  }
}

}  // namespace wb::ingest
