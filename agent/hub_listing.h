// What the Hugging Face hub answers that the agent downloads a model by (agent/hub.h), parsed
// apart from the HTTP around it: a server's bytes, so any of them must give a listing or an
// error, never an exception (tests/fuzz/hub_listing_fuzz.cc tries them).
#ifndef LLMCTL_AGENT_HUB_LISTING_H_
#define LLMCTL_AGENT_HUB_LISTING_H_

#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"

namespace llmctl::agent {

inline constexpr char kHubIndexFile[] = "model.safetensors.index.json";

// One file of a revision, as the hub lists it.
struct HubFile {
  int64_t size = 0;         // bytes, as listed (every file's, with ?blobs=true): 0 to INT64_MAX
  std::string git_blob_id;  // sha1 of "blob <size>\0" + bytes; "" when not listed
  std::string lfs_sha256;   // LFS files only: 64 lower-case hex digits; "" for the others
};

struct HubListing {
  std::string commit;                    // 40 lower-case hex digits
  std::map<std::string, HubFile> files;  // by path in the repository, as listed
};

// A commit as the hub names it: 40 lower-case hex digits.
bool IsCommitHex(std::string_view text);

// Relative, '/'-separated, no empty, "." or ".." component, no '\\' or NUL: safe to join under a
// directory.
bool IsSafeRelativePath(std::string_view path);

// GET {endpoint}/api/models/{repo}/revision/{rev}?blobs=true's body: the commit ("sha") and the
// files ("siblings": rfilename, size, blobId, lfs.sha256, lfs.size). DataLoss "WHAT: the hub's
// answer is not a model listing: ..." for anything else; `what` names the model.
StatusOr<HubListing> ParseHubListing(std::string_view body, const std::string& what);

// The shard files a model.safetensors.index.json's weight_map names, sorted, each once, each
// IsSafeRelativePath. DataLoss "WHAT: model.safetensors.index.json ..." for anything else: an
// empty or missing weight_map, a file that is not a relative name inside the repository.
StatusOr<std::vector<std::string>> ParseIndexShards(std::string_view text, const std::string& what);

}  // namespace llmctl::agent

#endif  // LLMCTL_AGENT_HUB_LISTING_H_
