#include "app/cli/cli.hpp"

#include <charconv>
#include <cstdlib>

namespace wb::cli {
namespace {

bool looks_numeric(std::string_view s) {
  if (s.size() < 2 || s[0] != '-') return false;
  char* end = nullptr;
  std::string copy(s);
  std::strtod(copy.c_str(), &end);
  return end != nullptr && *end == '\0';
}

std::string first_line(const std::string& text) { return text.substr(0, text.find('\n')); }

}  // namespace

Args::Args(int argc, char** argv, std::string usage, std::initializer_list<FlagSpec> flags)
    : command_(argc > 0 ? argv[0] : "?"), usage_(std::move(usage)) {
  bool only_positionals = false;
  for (int i = 1; i < argc; ++i) {
    std::string_view arg = argv[i];
    if (only_positionals || arg.empty() || arg[0] != '-' || arg == "-" || looks_numeric(arg)) {
      positional_.emplace_back(arg);
      continue;
    }
    if (arg == "--") {
      only_positionals = true;
      continue;
    }
    if (arg == "--help" || arg == "-h") throw HelpRequested(usage_);
    std::string_view name = arg;
    std::optional<std::string> inline_value;
    if (auto eq = arg.find('='); eq != std::string_view::npos) {
      name = arg.substr(0, eq);
      inline_value = std::string(arg.substr(eq + 1));
    }
    const FlagSpec* spec = nullptr;
    for (const FlagSpec& f : flags)
      if (f.name == name) spec = &f;
    if (spec == nullptr) fail("unknown flag " + std::string(name) + " (usage: " + first_line(usage_) + ")");
    if (spec->takes_value) {
      if (!inline_value) {
        if (i + 1 >= argc) fail(std::string(name) + " needs a value (usage: " + first_line(usage_) + ")");
        inline_value = argv[++i];
      }
      values_[std::string(name)] = *inline_value;
      all_.emplace_back(std::string(name), *inline_value);
    } else {
      if (inline_value) fail(std::string(name) + " takes no value");
      values_[std::string(name)] = "";
    }
  }
}

const std::vector<std::string>& Args::positionals(std::size_t min, int max) const {
  bool too_few = positional_.size() < min;
  bool too_many = max >= 0 && positional_.size() > static_cast<std::size_t>(max);
  if (too_few || too_many) {
    std::string expected = std::to_string(min);
    if (max < 0)
      expected = "at least " + expected;
    else if (static_cast<std::size_t>(max) != min)
      expected += " to " + std::to_string(max);
    fail("expected " + expected + " argument(s), got " + std::to_string(positional_.size()) +
         " (usage: " + first_line(usage_) + ")");
  }
  return positional_;
}

bool Args::has(std::string_view flag) const { return values_.find(flag) != values_.end(); }

std::vector<std::string> Args::values(std::string_view flag) const {
  std::vector<std::string> out;
  for (const auto& [name, v] : all_)
    if (name == flag) out.push_back(v);
  return out;
}

std::optional<std::string> Args::value(std::string_view flag) const {
  auto it = values_.find(flag);
  if (it == values_.end()) return std::nullopt;
  return it->second;
}

std::string Args::value_or(std::string_view flag, std::string fallback) const {
  auto v = value(flag);
  return v ? *v : std::move(fallback);
}

std::optional<std::int64_t> Args::int_value(std::string_view flag, std::int64_t min, std::int64_t max) const {
  auto v = value(flag);
  if (!v) return std::nullopt;
  std::int64_t out = 0;
  auto [ptr, ec] = std::from_chars(v->data(), v->data() + v->size(), out);
  if (ec != std::errc() || ptr != v->data() + v->size() || v->empty())
    fail(std::string(flag) + " expects an integer, got '" + *v + "'");
  if (out < min || out > max)
    fail(std::string(flag) + " is " + *v + ", expected a value in [" + std::to_string(min) + ", " + std::to_string(max) + "]");
  return out;
}

void Args::fail(std::string_view message) const {
  throw UsageError("wb " + command_ + ": " + std::string(message));
}

}  // namespace wb::cli
