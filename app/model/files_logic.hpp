// The file side of the shell, free of ImGui: the recent-files list (~/.config/wb-view/recent.txt, one
// path a line, newest first) and directory listings for the built-in file browser.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

namespace wb::app_model {

inline constexpr std::size_t kMaxRecent = 12;

// $XDG_CONFIG_HOME/wb-view/recent.txt, else $HOME/.config/wb-view/recent.txt.
std::filesystem::path recent_files_path();
// Missing file: an empty list. Blank lines are skipped.
std::vector<std::string> read_recent(const std::filesystem::path& file);
// Creates the directory when needed; returns false when the file cannot be written (not fatal).
bool write_recent(const std::filesystem::path& file, const std::vector<std::string>& list);
// Moves (or inserts) path to the front, drops duplicates, keeps at most max entries.
void push_recent(std::vector<std::string>& list, const std::string& path, std::size_t max = kMaxRecent);

struct DirEntry {
  std::string name;
  bool is_dir = false;
  std::uintmax_t size = 0;
};
// Directories first, then files whose extension is in `extensions` (all when empty), by name; hidden
// entries left out. An unreadable directory gives an empty list.
std::vector<DirEntry> list_directory(const std::filesystem::path& dir, const std::vector<std::string>& extensions);

}  // namespace wb::app_model
