#include "common/rank_files.h"

#include <filesystem>

namespace llmctl {

std::string RankEventsPath(const std::string& path, int rank) {
  if (rank == 0 || path.empty()) return path;
  const std::filesystem::path p(path);
  std::filesystem::path named = p.parent_path() / p.stem();
  named += ".rank" + std::to_string(rank);
  named += p.extension();
  return named.string();
}

}  // namespace llmctl
