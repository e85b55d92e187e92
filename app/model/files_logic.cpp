#include "app/model/files_logic.hpp"

#include <algorithm>
#include <cstdlib>
#include <fstream>

namespace wb::app_model {

std::filesystem::path recent_files_path() {
  std::filesystem::path base;
  if (const char* xdg = std::getenv("XDG_CONFIG_HOME"); xdg && *xdg) base = xdg;
  else if (const char* home = std::getenv("HOME"); home && *home) base = std::filesystem::path(home) / ".config";
  else base = "/tmp";
  return base / "wb-view" / "recent.txt";
}

std::vector<std::string> read_recent(const std::filesystem::path& file) {
  std::vector<std::string> out;
  std::ifstream in(file);
  std::string line;
  while (std::getline(in, line)) {
    while (!line.empty() && (line.back() == '\r' || line.back() == ' ')) line.pop_back();
    if (!line.empty()) out.push_back(line);
  }
  return out;
}

bool write_recent(const std::filesystem::path& file, const std::vector<std::string>& list) {
  std::error_code ec;
  std::filesystem::create_directories(file.parent_path(), ec);
  std::ofstream out(file, std::ios::trunc);
  for (const auto& p : list) out << p << "\n";
  return static_cast<bool>(out);
}

void push_recent(std::vector<std::string>& list, const std::string& path, std::size_t max) {
  std::erase(list, path);
  list.insert(list.begin(), path);
  if (list.size() > max) list.resize(max);
}

std::vector<DirEntry> list_directory(const std::filesystem::path& dir, const std::vector<std::string>& extensions) {
  std::vector<DirEntry> out;
  std::error_code ec;
  for (std::filesystem::directory_iterator it(dir, std::filesystem::directory_options::skip_permission_denied, ec), end;
       !ec && it != end; it.increment(ec)) {
    DirEntry e;
    e.name = it->path().filename().string();
    if (e.name.empty() || e.name[0] == '.') continue;
    std::error_code ec2;
    e.is_dir = it->is_directory(ec2);
    if (!e.is_dir) {
      if (!extensions.empty()) {
        std::string ext = it->path().extension().string();
        if (std::find(extensions.begin(), extensions.end(), ext) == extensions.end()) continue;
      }
      e.size = it->file_size(ec2);
    }
    out.push_back(std::move(e));
  }
  std::sort(out.begin(), out.end(), [](const DirEntry& a, const DirEntry& b) {
    return a.is_dir != b.is_dir ? a.is_dir : a.name < b.name;
  });
  return out;
}

}  // namespace wb::app_model
