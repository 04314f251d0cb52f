#include "common/rank_files.h"

#include <filesystem>
#include <string_view>

namespace llmctl {

std::string RankEventsPath(const std::string& path, int rank) {
  if (rank == 0 || path.empty()) return path;
  const std::filesystem::path p(path);
  std::filesystem::path named = p.parent_path() / p.stem();
  named += ".rank" + std::to_string(rank);
  named += p.extension();
  return named.string();
}

std::string RankOptimizerFile(int rank) {
  return rank == 0 ? "optimizer.safetensors"
                   : "optimizer.rank" + std::to_string(rank) + ".safetensors";
}

int RankOfOptimizerFile(const std::string& file) {
  if (file == RankOptimizerFile(0)) return 0;
  constexpr std::string_view kPrefix = "optimizer.rank";
  constexpr std::string_view kSuffix = ".safetensors";
  if (!file.starts_with(kPrefix) || !file.ends_with(kSuffix)) return -1;
  const std::string digits =
      file.substr(kPrefix.size(), file.size() - kPrefix.size() - kSuffix.size());
  // Digits only, no leading zero, and small enough to be a rank: RankOptimizerFile's own spelling.
  if (digits.empty() || digits.size() > 9 || digits.front() == '0' ||
      digits.find_first_not_of("0123456789") != std::string::npos) {
    return -1;
  }
  return std::stoi(digits);
}

}  // namespace llmctl
