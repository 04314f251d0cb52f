// Fuzz target for what the Hugging Face hub answers the agent (agent/hub_listing.h): a revision's
// listing (ParseHubListing: GET /api/models/REPO/revision/REV?blobs=true) and a repository's
// model.safetensors.index.json (ParseIndexShards), which name the files the agent downloads and
// where it puts them. A server's bytes: any of them must give a listing or an error, never a crash,
// an exception or a hang. Each input is read as both.
//
// Beyond "no crash", the header's promises:
// - a refusal is DataLoss with a message that names the model and the file ("WHAT: the hub's
//   answer is not a model listing: ...", "WHAT: model.safetensors.index.json ...") and says more;
// - a listing's commit is 40 lower-case hex digits, every size is 0 to INT64_MAX and every
//   lfs.sha256 kept is 64 lower-case hex digits (or none);
// - the shards are sorted, each once, and each joined under the model directory stays inside it
//   (checked here without IsSafeRelativePath: no absolute path, no empty, "." or ".." part, no
//   '\\' or NUL, and the lexically normal join is below the directory).
//
// Replayed over tests/fuzz/corpus/hub_listing/ by the `hub_listing_fuzz_replay` test, with seeded
// mutations. To fuzz for real (clang with libFuzzer: apt-get install clang libclang-rt-14-dev),
// from the repository root, in bash:
//
//   SRCS="tests/fuzz/hub_listing_fuzz.cc agent/hub_listing.cc common/foreign_json.cc common/text.cc
//         common/status.cc common/digest/digest.cc"
//   clang++ -std=c++20 -g -O1 -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=all
//       -I. $SRCS $(pkg-config --cflags --libs libcrypto) -o /tmp/hub_listing_fuzz  # one line
//   mkdir -p /tmp/hub_listing_corpus
//   /tmp/hub_listing_fuzz -max_total_time=300 -max_len=4096 -timeout=10
//       -dict=tests/fuzz/hub_listing_fuzz.dict /tmp/hub_listing_corpus
//       tests/fuzz/corpus/hub_listing                                             # one line
//
// Inputs that crash go into tests/fuzz/corpus/hub_listing/ with the fix.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

#include "agent/hub_listing.h"
#include "common/status.h"

namespace {

void Check(bool condition) {
  if (!condition) std::abort();
}

constexpr char kWhat[] = "Hugging Face model org/name@main";
constexpr char kModelDir[] =
    "/var/lib/llmctl/cache/hub/org/name/0123456789abcdef0123456789abcdef01234567";

bool IsLowerHex(std::string_view text, size_t digits) {
  if (text.size() != digits) return false;
  for (char c : text) {
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
  }
  return true;
}

// A refusal of kind DataLoss whose message begins with `prefix` and says more after it.
void CheckRefusal(const llmctl::Status& status, const std::string& prefix) {
  Check(status.code() == llmctl::StatusCode::kDataLoss);
  Check(status.message().starts_with(prefix));
  Check(status.message().size() > prefix.size());
}

// `shard` joined under kModelDir stays inside it, by a rule of this file's own.
void CheckInsideModelDir(const std::string& shard) {
  Check(!shard.empty() && shard.front() != '/');
  Check(shard.find('\\') == std::string::npos && shard.find('\0') == std::string::npos);
  size_t start = 0;
  while (true) {
    const size_t end = shard.find('/', start);
    const std::string part = shard.substr(start, end == std::string::npos ? end : end - start);
    Check(!part.empty() && part != "." && part != "..");
    if (end == std::string::npos) break;
    start = end + 1;
  }
  const std::string joined = (std::filesystem::path(kModelDir) / shard).lexically_normal().string();
  Check(joined.starts_with(std::string(kModelDir) + "/"));
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);

  const llmctl::StatusOr<llmctl::agent::HubListing> listing =
      llmctl::agent::ParseHubListing(text, kWhat);
  if (!listing.ok()) {
    CheckRefusal(listing.status(),
                 std::string(kWhat) + ": the hub's answer is not a model listing: ");
  } else {
    Check(IsLowerHex(listing->commit, 40));
    for (const auto& [path, file] : listing->files) {
      Check(file.size >= 0);
      Check(file.lfs_sha256.empty() || IsLowerHex(file.lfs_sha256, 64));
    }
  }

  const llmctl::StatusOr<std::vector<std::string>> shards =
      llmctl::agent::ParseIndexShards(text, kWhat);
  if (!shards.ok()) {
    CheckRefusal(shards.status(), std::string(kWhat) + ": model.safetensors.index.json");
  } else {
    Check(!shards->empty());
    for (size_t i = 0; i < shards->size(); ++i) {
      CheckInsideModelDir((*shards)[i]);
      if (i > 0) Check((*shards)[i - 1] < (*shards)[i]);
    }
  }
  return 0;
}
