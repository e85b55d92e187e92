// Chrome-trace JSON writer. Events stream out track by track through one large buffer (to_chars, names
// escaped once per id); thread tracks go first so kernels can point flow arrows at their launching ranges.
#include "profiler/analysis/chrome_export.hpp"

#include <algorithm>
#include <array>
#include <charconv>
#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <string_view>
#include <tuple>
#include <unordered_map>
#include <vector>

#include "store/db.hpp"
#include "store/reader.hpp"

namespace wb::analysis {

namespace {

// Appends JSON text to a large buffer written out in big blocks; formatting goes through to_chars,
// which is what keeps the export well above a million events per second.
class JsonOut {
 public:
  explicit JsonOut(const std::filesystem::path& path) : path_(path) {
    file_ = std::fopen(path.c_str(), "wb");
    if (file_ == nullptr) throw std::runtime_error(path.string() + ": cannot open for writing (" + std::strerror(errno) + ")");
    buf_.reserve(kBlock + 4096);
  }
  ~JsonOut() {
    if (file_ != nullptr) std::fclose(file_);
  }
  void raw(std::string_view s) {
    buf_.append(s);
    if (buf_.size() >= kBlock) drain();
  }
  void integer(std::int64_t v) {
    char tmp[24];
    auto r = std::to_chars(tmp, tmp + sizeof tmp, v);
    buf_.append(tmp, r.ptr);
  }
  void number(double v) {
    char tmp[32];
    auto r = std::to_chars(tmp, tmp + sizeof tmp, v);
    buf_.append(tmp, r.ptr);
  }
  // Nanoseconds as microseconds with three exact decimals.
  void micros(std::int64_t ns) {
    if (ns < 0) {
      buf_.push_back('-');
      ns = -ns;
    }
    integer(ns / 1000);
    std::int64_t frac = ns % 1000;
    if (frac != 0) {
      char tmp[4] = {'.', static_cast<char>('0' + frac / 100), static_cast<char>('0' + frac / 10 % 10), static_cast<char>('0' + frac % 10)};
      buf_.append(tmp, 4);
    }
  }
  void close() {
    drain();
    if (std::fclose(file_) != 0) {
      file_ = nullptr;
      throw std::runtime_error(path_.string() + ": write failed (" + std::strerror(errno) + ")");
    }
    file_ = nullptr;
  }

 private:
  static constexpr std::size_t kBlock = std::size_t{1} << 22;
  void drain() {
    if (!buf_.empty() && std::fwrite(buf_.data(), 1, buf_.size(), file_) != buf_.size()) {
      throw std::runtime_error(path_.string() + ": write failed (" + std::strerror(errno) + ")");
    }
    buf_.clear();
  }
  std::filesystem::path path_;
  std::FILE* file_ = nullptr;
  std::string buf_;
};

std::string json_string(std::string_view s) {
  std::string out = "\"";
  for (char c : s) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\t': out += "\\t"; break;
      case '\r': out += "\\r"; break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          char tmp[8];
          std::snprintf(tmp, sizeof tmp, "\\u%04x", static_cast<unsigned>(static_cast<unsigned char>(c)));
          out += tmp;
        } else {
          out += c;
        }
    }
  }
  return out + "\"";
}

constexpr std::int64_t kAllreduceTid = 2'000'000'000;  // a lane per rank for the bucket spans
constexpr std::int64_t kPipelineTid = 2'000'000'001;   // a lane per rank for pipeline micro-batches
constexpr std::int64_t kP2pTid = 2'000'000'002;        // and one for the messages between stages

// A range that launched device work: where the flow arrow to its kernels starts.
struct Launch {
  std::int64_t pid;
  std::int64_t tid;
  std::int64_t ts;
};

// Writes the trace's events to `out`, counting them in `stats`; times are relative to `origin`.
struct TraceWriter {
  TraceWriter(store::Reader& source, const std::filesystem::path& path, ChromeExportStats& counts)
      : reader(source), strings(source.strings()), quoted(strings.size()), out(path), stats(counts), origin(counts.origin_ns) {
    for (int c = 0; c < store::kCategories; ++c) {
      category_json[static_cast<std::size_t>(c)] = json_string(std::string(store::category_name(static_cast<store::Category>(c))));
    }
  }

  // A string id's text as JSON, escaped on first use.
  const std::string& name(std::uint32_t id) {
    static const std::string unknown = "\"?\"";
    if (id >= quoted.size()) return unknown;
    if (quoted[id].empty()) quoted[id] = json_string(strings[id]);
    return quoted[id];
  }

  void begin_event() {
    out.raw(first ? "\n" : ",\n");
    first = false;
    ++stats.events;
  }

  void write_header() {
    out.raw("{\"displayTimeUnit\":\"ns\",\"otherData\":{\"origin_ns\":");
    out.integer(origin);
    out.raw("},\"traceEvents\":[");
  }

  // A process per rank, named for its host and device and sorted by rank.
  void write_process_names() {
    for (const auto& r : reader.ranks()) {
      begin_event();
      out.raw("{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":");
      out.integer(r.rank);
      out.raw(",\"args\":{\"name\":");
      out.raw(json_string("rank " + std::to_string(r.rank) + " (" + r.host + ", " + r.device + ")"));
      out.raw("}}");
      begin_event();
      out.raw("{\"name\":\"process_sort_index\",\"ph\":\"M\",\"pid\":");
      out.integer(r.rank);
      out.raw(",\"args\":{\"sort_index\":");
      out.integer(r.rank);
      out.raw("}}");
    }
  }

  // Every track with its events: thread tracks first so every kernel's launching range is known when
  // the kernels are written.
  void write_tracks() {
    auto tracks = reader.tracks();
    for (int pass = 0; pass < 2; ++pass) {
      for (const auto& t : tracks) {
        bool device = t.kind == store::TrackKind::stream;
        if ((pass == 0) == device) continue;
        write_thread_name(t);
        if (t.kind == store::TrackKind::queue) {
          write_counters(t);
        } else if (!device) {
          write_ranges(t);
        } else {
          for (const auto& k : reader.kernels(t.id)) write_kernel(t, k);
        }
      }
    }
  }

  void write_thread_name(const store::TrackRow& t) {
    begin_event();
    out.raw("{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":");
    out.integer(t.rank);
    out.raw(",\"tid\":");
    out.integer(t.id);
    out.raw(",\"args\":{\"name\":");
    out.raw(name(t.name));
    out.raw("}}");
  }

  // A queue track's depth samples as counter events.
  void write_counters(const store::TrackRow& t) {
    for (const auto& c : reader.counters(t.id)) {
      begin_event();
      out.raw("{\"name\":");
      out.raw(name(t.name));
      out.raw(",\"ph\":\"C\",\"pid\":");
      out.integer(t.rank);
      out.raw(",\"tid\":");
      out.integer(t.id);
      out.raw(",\"ts\":");
      out.micros(c.t_ns - origin);
      out.raw(",\"args\":{\"depth\":");
      out.number(c.value);
      out.raw("}}");
      ++stats.counters;
    }
  }

  // A thread track's ranges, remembering those that launched device work.
  void write_ranges(const store::TrackRow& t) {
    for (const auto& r : reader.ranges(t.id)) {
      begin_event();
      out.raw("{\"name\":");
      out.raw(name(r.name));
      out.raw(",\"cat\":");
      out.raw(r.category < store::kCategories ? category_json[r.category] : std::string("\"other\""));
      out.raw(",\"ph\":\"X\",\"pid\":");
      out.integer(t.rank);
      out.raw(",\"tid\":");
      out.integer(t.id);
      out.raw(",\"ts\":");
      out.micros(r.start_ns - origin);
      out.raw(",\"dur\":");
      out.micros(r.end_ns - r.start_ns);
      out.raw(",\"args\":{\"step\":");
      out.integer(r.step);
      if (r.corr_id != 0) {
        out.raw(",\"corr\":");
        out.integer(static_cast<std::int64_t>(r.corr_id));
        launches.emplace(r.corr_id, Launch{t.rank, t.id, r.start_ns});
      }
      out.raw("}}");
      ++stats.ranges;
    }
  }

  // A device activity, and the flow arrow from the range that launched it when that is known.
  void write_kernel(const store::TrackRow& t, const store::KernelRow& k) {
    begin_event();
    out.raw("{\"name\":");
    out.raw(name(k.name));
    out.raw(k.kind == 0 ? ",\"cat\":\"kernel\"" : k.kind == 1 ? ",\"cat\":\"memcpy\"" : ",\"cat\":\"memset\"");
    out.raw(",\"ph\":\"X\",\"pid\":");
    out.integer(t.rank);
    out.raw(",\"tid\":");
    out.integer(t.id);
    out.raw(",\"ts\":");
    out.micros(k.start_ns - origin);
    out.raw(",\"dur\":");
    out.micros(k.end_ns - k.start_ns);
    out.raw(",\"args\":{");
    write_kernel_args(k);
    out.raw("}}");
    ++stats.kernels;
    auto it = k.corr_id != 0 ? launches.find(k.corr_id) : launches.end();
    if (it != launches.end()) write_launch_flow(it->second, t, k);
  }

  // A kernel's grid and block, or a copy's or set's bytes; then its correlation id.
  void write_kernel_args(const store::KernelRow& k) {
    if (k.kind == 0) {
      out.raw("\"grid\":[");
      for (int i = 0; i < 3; ++i) {
        if (i > 0) out.raw(",");
        out.integer(k.grid[i]);
      }
      out.raw("],\"block\":[");
      for (int i = 0; i < 3; ++i) {
        if (i > 0) out.raw(",");
        out.integer(k.block[i]);
      }
      out.raw("]");
    } else {
      out.raw("\"bytes\":");
      out.integer(k.bytes);
    }
    if (k.corr_id != 0) {
      out.raw(",\"corr\":");
      out.integer(static_cast<std::int64_t>(k.corr_id));
    }
  }

  void write_launch_flow(const Launch& launch, const store::TrackRow& t, const store::KernelRow& k) {
    std::int64_t flow_id = ++stats.flows;
    begin_event();
    out.raw("{\"name\":\"launch\",\"cat\":\"launch\",\"ph\":\"s\",\"id\":");
    out.integer(flow_id);
    out.raw(",\"pid\":");
    out.integer(launch.pid);
    out.raw(",\"tid\":");
    out.integer(launch.tid);
    out.raw(",\"ts\":");
    out.micros(launch.ts - origin);
    out.raw("}");
    begin_event();
    out.raw("{\"name\":\"launch\",\"cat\":\"launch\",\"ph\":\"f\",\"bp\":\"e\",\"id\":");
    out.integer(flow_id);
    out.raw(",\"pid\":");
    out.integer(t.rank);
    out.raw(",\"tid\":");
    out.integer(t.id);
    out.raw(",\"ts\":");
    out.micros(k.start_ns - origin);
    out.raw("}");
  }

  // The allreduce bucket spans, on a lane per rank.
  void write_allreduces() {
    auto allreduces = reader.allreduces();
    std::vector<int> lanes;
    for (const auto& a : allreduces) {
      if (std::find(lanes.begin(), lanes.end(), a.rank) == lanes.end()) {
        lanes.push_back(a.rank);
        begin_event();
        out.raw("{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":");
        out.integer(a.rank);
        out.raw(",\"tid\":");
        out.integer(kAllreduceTid);
        out.raw(",\"args\":{\"name\":\"allreduce buckets\"}}");
      }
      begin_event();
      out.raw("{\"name\":\"bucket ");
      out.integer(a.bucket);
      out.raw("\",\"cat\":\"allreduce\",\"ph\":\"X\",\"pid\":");
      out.integer(a.rank);
      out.raw(",\"tid\":");
      out.integer(kAllreduceTid);
      out.raw(",\"ts\":");
      out.micros(a.start_ns - origin);
      out.raw(",\"dur\":");
      out.micros(a.end_ns - a.start_ns);
      out.raw(",\"args\":{\"step\":");
      out.integer(a.step);
      out.raw(",\"params\":[");
      out.integer(a.first_param);
      out.raw(",");
      out.integer(a.last_param);
      out.raw("],\"bytes\":");
      out.integer(a.bytes);
      out.raw(",\"ready_to_start_us\":");
      out.micros(a.start_ns - a.ready_ns);
      out.raw("}}");
      ++stats.allreduces;
    }
  }

  // Pipeline runs: each micro-batch's forward (F<m>) and backward (B<m>) and each message on a lane
  // per rank, and a flow arrow from every send's post to the matching receive's completion.
  void write_pipeline() {
    auto spans = reader.pipeline_spans();
    std::vector<int> pipe_lanes;
    std::map<std::tuple<int, int, int, int>, const store::PipelineSpanRow*> receives;  // (to, step, micro, grad?)
    for (const auto& p : spans) {
      if (p.kind == "recv_act" || p.kind == "recv_grad") receives[{p.rank, p.step, p.micro, p.kind == "recv_grad"}] = &p;
    }
    for (const auto& p : spans) {
      if (std::find(pipe_lanes.begin(), pipe_lanes.end(), p.rank) == pipe_lanes.end()) {
        pipe_lanes.push_back(p.rank);
        write_pipeline_lane_names(p);
      }
      write_pipeline_span(p);
      if (p.kind != "send_act" && p.kind != "send_grad") continue;
      auto it = receives.find({p.peer, p.step, p.micro, p.kind == "send_grad"});
      if (it == receives.end()) continue;
      write_p2p_flow(p, *it->second);
    }
  }

  // The names of a rank's two pipeline lanes: its micro-batches and its messages.
  void write_pipeline_lane_names(const store::PipelineSpanRow& p) {
    for (const std::int64_t tid : {kPipelineTid, kP2pTid}) {
      begin_event();
      out.raw("{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":");
      out.integer(p.rank);
      out.raw(",\"tid\":");
      out.integer(tid);
      out.raw(",\"args\":{\"name\":\"pipeline stage ");
      out.integer(p.stage);
      out.raw(tid == kPipelineTid ? " micro-batches\"}}" : " messages\"}}");
    }
  }

  void write_pipeline_span(const store::PipelineSpanRow& p) {
    const bool compute = p.kind == "forward" || p.kind == "backward";
    const std::int64_t tid = compute ? kPipelineTid : kP2pTid;
    begin_event();
    out.raw("{\"name\":\"");
    if (compute) {
      out.raw(p.kind == "forward" ? "F" : "B");
      out.integer(p.micro);
    } else {
      out.raw(p.kind);
      out.raw(" ");
      out.integer(p.micro);
    }
    out.raw(compute ? "\",\"cat\":\"pipeline\",\"ph\":\"X\",\"pid\":" : "\",\"cat\":\"p2p\",\"ph\":\"X\",\"pid\":");
    out.integer(p.rank);
    out.raw(",\"tid\":");
    out.integer(tid);
    // A send shows from its post to its completion; a receive from when the stage began waiting.
    out.raw(",\"ts\":");
    out.micros(p.start_ns - origin);
    out.raw(",\"dur\":");
    out.micros(p.end_ns - p.start_ns);
    out.raw(",\"args\":{\"step\":");
    out.integer(p.step);
    out.raw(",\"stage\":");
    out.integer(p.stage);
    out.raw(",\"micro_batch\":");
    out.integer(p.micro);
    if (!compute) {
      out.raw(",\"peer\":");
      out.integer(p.peer);
      out.raw(",\"bytes\":");
      out.integer(p.bytes);
      out.raw(",\"posted_us\":");
      out.micros(p.post_ns - origin);
    }
    out.raw("}}");
    ++stats.p2p;
  }

  // The flow arrow from a send's post to the completion of its receive.
  void write_p2p_flow(const store::PipelineSpanRow& send, const store::PipelineSpanRow& recv) {
    const std::int64_t flow_id = ++stats.flows;
    begin_event();
    out.raw("{\"name\":\"");
    out.raw(send.kind == "send_act" ? "activations" : "gradients");
    out.raw("\",\"cat\":\"p2p\",\"ph\":\"s\",\"id\":");
    out.integer(flow_id);
    out.raw(",\"pid\":");
    out.integer(send.rank);
    out.raw(",\"tid\":");
    out.integer(kP2pTid);
    out.raw(",\"ts\":");
    out.micros(send.post_ns - origin);
    out.raw("}");
    begin_event();
    out.raw("{\"name\":\"");
    out.raw(send.kind == "send_act" ? "activations" : "gradients");
    out.raw("\",\"cat\":\"p2p\",\"ph\":\"f\",\"bp\":\"e\",\"id\":");
    out.integer(flow_id);
    out.raw(",\"pid\":");
    out.integer(recv.rank);
    out.raw(",\"tid\":");
    out.integer(kP2pTid);
    out.raw(",\"ts\":");
    out.micros(std::max(recv.end_ns, send.post_ns) - origin);
    out.raw("}");
  }

  void finish() {
    out.raw("\n]}\n");
    out.close();
  }

  store::Reader& reader;
  const std::vector<std::string>& strings;
  std::vector<std::string> quoted;  // each name escaped once
  std::array<std::string, store::kCategories> category_json;  // the categories' names, quoted
  JsonOut out;
  ChromeExportStats& stats;
  const std::int64_t origin;
  bool first = true;
  std::unordered_map<std::uint64_t, Launch> launches;  // corr_id -> launching range
};

}  // namespace

ChromeExportStats export_chrome(store::Reader& reader, const std::filesystem::path& path) {
  ChromeExportStats stats;
  stats.origin_ns = reader.db().query_int64(
      "SELECT coalesce(min(t), 0) FROM (SELECT min(start_ns) AS t FROM range UNION ALL SELECT min(start_ns) FROM kernel "
      "UNION ALL SELECT min(t_ns) FROM counter UNION ALL SELECT min(ready_ns) FROM allreduce "
      "UNION ALL SELECT min(start_ns) FROM step)");
  TraceWriter trace(reader, path, stats);
  trace.write_header();
  trace.write_process_names();
  trace.write_tracks();
  trace.write_allreduces();
  trace.write_pipeline();
  trace.finish();
  return stats;
}

}  // namespace wb::analysis
