#include "agent/hub_listing.h"

#include <algorithm>
#include <limits>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>

#include "common/digest/digest.h"
#include "common/foreign_json.h"
#include "common/text.h"

namespace llmctl::agent {
namespace {

// An object's "size" when it is an integer from 0 to INT64_MAX; none otherwise.
std::optional<int64_t> ListedSize(const nlohmann::json& object) {
  const auto size = object.find("size");
  if (size == object.end() || !size->is_number_integer()) return std::nullopt;
  if (size->is_number_unsigned()) {
    const uint64_t value = size->get<uint64_t>();
    if (value > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) return std::nullopt;
    return static_cast<int64_t>(value);
  }
  const int64_t value = size->get<int64_t>();
  if (value < 0) return std::nullopt;
  return value;
}

}  // namespace

bool IsCommitHex(std::string_view text) {
  return text.size() == 40 && std::all_of(text.begin(), text.end(), [](char c) {
           return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f');
         });
}

bool IsSafeRelativePath(std::string_view path) {
  if (path.empty() || path.front() == '/' || path.find('\\') != std::string_view::npos ||
      path.find('\0') != std::string_view::npos) {
    return false;
  }
  size_t start = 0;
  while (start <= path.size()) {
    const size_t end = std::min(path.find('/', start), path.size());
    const std::string_view part = path.substr(start, end - start);
    if (part.empty() || part == "." || part == "..") return false;
    start = end + 1;
  }
  return true;
}

StatusOr<HubListing> ParseHubListing(std::string_view body, const std::string& what) {
  const nlohmann::json json = ParseForeignJson(body);
  auto bad = [&](const std::string& problem) {
    return DataLossError(what + ": the hub's answer is not a model listing: " + problem);
  };
  if (json.is_discarded() || !json.is_object()) return bad("not a JSON object");
  const auto sha = json.find("sha");
  if (sha == json.end() || !sha->is_string() || !IsCommitHex(sha->get<std::string>())) {
    return bad("no 40-hex 'sha'");
  }
  const auto siblings = json.find("siblings");
  if (siblings == json.end() || !siblings->is_array()) return bad("no 'siblings' list");
  HubListing listing;
  listing.commit = sha->get<std::string>();
  for (const nlohmann::json& sibling : *siblings) {
    const auto name = sibling.find("rfilename");
    if (!sibling.is_object() || name == sibling.end() || !name->is_string()) {
      return bad("a sibling without 'rfilename'");
    }
    // The name as the errors quote it: the hub's words, which reach the trial's error and every
    // terminal that shows it.
    const std::string shown = OnOneLine(name->get<std::string>());
    // The size caps the download and sizes the room it needs: a file without one could be
    // endless (the HTTP client takes a cap of 0 as none).
    HubFile file;
    const std::optional<int64_t> size = ListedSize(sibling);
    if (!size.has_value()) return bad(shown + " has no size (a non-negative integer)");
    file.size = *size;
    if (auto blob = sibling.find("blobId"); blob != sibling.end() && blob->is_string()) {
      file.git_blob_id = blob->get<std::string>();
    }
    if (auto lfs = sibling.find("lfs"); lfs != sibling.end() && lfs->is_object()) {
      const auto sha256 = lfs->find("sha256");
      if (sha256 == lfs->end() || !sha256->is_string() ||
          !digest::IsSha256Hex(sha256->get<std::string>())) {
        return bad(shown + " is an LFS file without a valid lfs.sha256");
      }
      file.lfs_sha256 = sha256->get<std::string>();
      if (lfs->contains("size")) {
        const std::optional<int64_t> lfs_size = ListedSize(*lfs);
        if (!lfs_size.has_value()) {
          return bad(shown + "'s lfs.size is not a non-negative integer");
        }
        file.size = *lfs_size;
      }
    }
    listing.files[name->get<std::string>()] = std::move(file);
  }
  return listing;
}

StatusOr<std::vector<std::string>> ParseIndexShards(std::string_view text,
                                                    const std::string& what) {
  const nlohmann::json json = ParseForeignJson(text);
  const auto map = json.is_object() ? json.find("weight_map") : json.end();
  if (json.is_discarded() || !json.is_object() || map == json.end() || !map->is_object() ||
      map->empty()) {
    return DataLossError(what + ": " + kHubIndexFile +
                         " has no weight_map of tensor names to files");
  }
  std::set<std::string> shards;
  for (const auto& [tensor, file] : map->items()) {
    if (!file.is_string() || !IsSafeRelativePath(file.get<std::string>())) {
      return DataLossError(what + ": " + kHubIndexFile + ": tensor " + OnOneLine(tensor) +
                           " maps to something that is not a relative file name");
    }
    shards.insert(file.get<std::string>());
  }
  return std::vector<std::string>(shards.begin(), shards.end());
}

}  // namespace llmctl::agent
