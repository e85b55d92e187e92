// Error messages quote text from outside input (a key of a JSON file, a header, a name stored in a
// file). one_line escapes its control characters, so every message stays the one line it promises
// however the input is damaged. The error types of the store, compare and the trainer's config apply it.
#pragma once

#include <string>
#include <string_view>

namespace wb::store {

inline std::string one_line(std::string_view text) {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out;
  out.reserve(text.size());
  for (char ch : text) {
    const auto c = static_cast<unsigned char>(ch);
    if (c >= 0x20 && c != 0x7f) {
      out += ch;
    } else if (c == '\n') {
      out += "\\n";
    } else {
      out += "\\x";
      out += kHex[c >> 4];
      out += kHex[c & 15];
    }
  }
  return out;
}

}  // namespace wb::store
