// What every fuzz target shares: the input as a scratch file (every parser here reads files by
// path), and the check that a parser's error is the one its contract promises: the module's own
// exception type, with a one-line message that names the file. Any other exception, a crash, a
// sanitizer report or a hang is a finding.
//
// Each target defines LLVMFuzzerTestOneInput. Built with -DWB_FUZZ=ON it links libFuzzer; in every
// build it also links replay_main.cpp into fuzz_replay_<target>, which feeds it the files of
// tests/fuzz-regressions/<target>/ (and any file or folder named on its command line).
#pragma once

#include <cstddef>
#include <cstdint>
#include <exception>
#include <filesystem>
#include <string>
#include <string_view>

namespace wb::fuzz {

// A private scratch folder for this process (in /dev/shm when there is one), removed at exit.
const std::filesystem::path& scratch_dir();
// Writes the input to scratch_dir()/name and returns the path.
std::filesystem::path write_input(std::string_view name, const std::uint8_t* data, std::size_t size);

// Aborts (a finding) unless the message is one non-empty line naming `file` (its file name).
void check_message(const std::exception& e, const std::filesystem::path& file);
// Aborts with the exception's type and message: an error the parser's contract does not allow.
[[noreturn]] void unexpected(const std::exception& e, std::string_view target);

}  // namespace wb::fuzz

// Runs the body (the arguments after `file`); `Expected` (the parser's error type) must carry a
// message naming `file`; any other exception aborts.
#define WB_FUZZ_GUARD(target, Expected, file, ...)         \
  try {                                                    \
    __VA_ARGS__;                                           \
  } catch (const Expected& e) {                            \
    ::wb::fuzz::check_message(e, (file));                  \
  } catch (const std::exception& e) {                      \
    ::wb::fuzz::unexpected(e, (target));                   \
  }
