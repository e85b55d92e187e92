// Small argument helpers shared by the `wb` subcommands (cmd_<name>.cpp).
//
// A handler receives argv[0] = its subcommand name, builds an Args with its usage text and the flags it
// knows, and reads positionals and flag values from it. Bad usage throws UsageError (main prints one line
// and exits 2); --help/-h throws HelpRequested (main prints the usage and exits 0).
#pragma once

#include <cstdint>
#include <initializer_list>
#include <limits>
#include <map>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace wb::cli {

class UsageError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

class HelpRequested : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;  // what() is the usage text
};

struct FlagSpec {
  std::string name;         // "--out"
  bool takes_value = true;  // false for switches like "--overwrite"
};

class Args {
 public:
  // Parses argv[1..argc): "--flag value", "--flag=value", switches, and positionals ("--" ends flags).
  Args(int argc, char** argv, std::string usage, std::initializer_list<FlagSpec> flags);

  const std::string& command() const { return command_; }
  const std::string& usage() const { return usage_; }

  // Exactly min..max positionals (max < 0: no upper limit), else UsageError naming what was expected.
  const std::vector<std::string>& positionals(std::size_t min, int max = -1) const;
  const std::vector<std::string>& positionals() const { return positional_; }

  bool has(std::string_view flag) const;
  std::optional<std::string> value(std::string_view flag) const;  // the last one given
  // Every value given for a flag that may repeat, in order.
  std::vector<std::string> values(std::string_view flag) const;
  std::string value_or(std::string_view flag, std::string fallback) const;
  // Integer flag value; UsageError naming the flag when it is not an integer in [min, max].
  std::optional<std::int64_t> int_value(std::string_view flag, std::int64_t min = std::numeric_limits<std::int64_t>::min(),
                                        std::int64_t max = std::numeric_limits<std::int64_t>::max()) const;

  // A UsageError prefixed with "wb <command>: ".
  [[noreturn]] void fail(std::string_view message) const;

 private:
  std::string command_;
  std::string usage_;
  std::vector<std::string> positional_;
  std::map<std::string, std::string, std::less<>> values_;
  std::vector<std::pair<std::string, std::string>> all_;
};

}  // namespace wb::cli
