// Model repositories from the Hugging Face hub, downloaded into the agent's input cache.
//
//   DATA/cache/hub/<org>/<name>/<commit>/       the model directory: hard links to the blobs
//   DATA/cache/hub/<org>/<name>/refs/<revision>  the commit a branch or tag named when prepared
//   DATA/cache/blobs/<sha256>                    each file's bytes (InputCache's blobs)
//   DATA/cache/tmp/hub-<...>.part                partial downloads, resumed by the next attempt
//
// The protocol is huggingface_hub's: GET {endpoint}/api/models/{repo}/revision/{rev}?blobs=true
// names the commit ("sha") and the files ("siblings": size, git blob id, and for LFS files
// lfs.sha256); each file comes from GET {endpoint}/{repo}/resolve/{commit}/{file}, which for LFS
// files redirects to a CDN. Every file is checked before it is used: LFS files against the
// listing's sha256, the others against their git blob id (sha1 of "blob <size>\0" + bytes). A
// model directory appears whole (assembled in tmp/ and renamed) or not at all.
#ifndef LLMCTL_AGENT_HUB_H_
#define LLMCTL_AGENT_HUB_H_

#include <chrono>
#include <cstdint>
#include <functional>
#include <future>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "agent/input_cache.h"
#include "common/http/http_client.h"
#include "common/model_config.h"
#include "common/mutex.h"
#include "common/status.h"

namespace llmctl::agent {

struct HubOptions {
  std::string endpoint = "https://huggingface.co";
  // Sent as "Authorization: Bearer <token>" when set (private and gated repositories); it never
  // appears in a message or a log.
  std::string token;
  // A hub or CDN that keeps a connection open and sends nothing: the transfer ends after this long,
  // not after a whole file's timeout (hours), and the client's next attempt resumes it.
  std::chrono::seconds stall_timeout = std::chrono::minutes(1);
  http::ClientOptions http;
};

// HubOptions with HF_ENDPOINT and HF_TOKEN from the environment, as huggingface_hub reads them.
HubOptions HubOptionsFromEnvironment();

struct PreparedModel {
  std::string path;    // the model directory
  std::string commit;  // the 40-hex commit the revision named
  int64_t bytes = 0;   // all files in the directory
};

// Thread-safe.
class HubCache {
 public:
  // `cache` is not owned and must outlive this.
  HubCache(HubOptions options, InputCache* cache);

  // The model directory for `ref` with `files` in it, downloaded when missing. Empty `files`: the
  // default set, i.e. config.json, generation_config.json if present, the tokenizer files present
  // (tokenizer.json, tokenizer_config.json, special_tokens_map.json, tokenizer.model) and the
  // safetensors weights (model.safetensors, or model.safetensors.index.json and every shard it
  // names). Concurrent calls for the same reference share one download, which ends (Cancelled)
  // once `cancelled` says true for every one of them; a caller that gives up alone leaves it
  // running for the others. `cancelled` (empty: never) is asked about once a second, from this
  // call's thread or another caller's, and must stay callable until this returns.
  // Errors: NotFound for an unknown repository, revision or file; PermissionDenied for a gated
  // repository the token may not read; Unauthenticated when the token is refused;
  // FailedPrecondition when the repository has no config.json or safetensors weights; DataLoss when
  // a file's size or digest differs from the listing (the download is discarded, nothing is
  // materialised); Unavailable / DeadlineExceeded when the hub cannot be reached (a later call
  // resumes).
  StatusOr<PreparedModel> Prepare(const HubModelRef& ref, const std::vector<std::string>& files,
                                  const std::function<bool()>& cancelled = {});

  // The directory an earlier Prepare made for `ref` (by commit, or by the commit its branch or tag
  // named then). FailedPrecondition "model hf:X not prepared on this node" when there is none.
  StatusOr<std::string> Find(const HubModelRef& ref) const;

 private:
  // One download in progress and the callers waiting for it (their `cancelled`).
  struct InFlight {
    std::shared_future<StatusOr<PreparedModel>> result;  // every caller reads the same result
    std::vector<const std::function<bool()>*> callers;
  };

  StatusOr<PreparedModel> Download(const HubModelRef& ref, const std::vector<std::string>& files,
                                   std::function<bool()> cancelled);
  // A later caller's wait for the download `key` another call runs.
  StatusOr<PreparedModel> AwaitDownload(const std::string& key,
                                        const std::shared_future<StatusOr<PreparedModel>>& running,
                                        const std::function<bool()>& cancelled)
      LLMCTL_EXCLUDES(mutex_);
  bool EveryCallerCancelled(const std::string& key) LLMCTL_EXCLUDES(mutex_);
  std::string RepoDir(const std::string& repo) const;
  // The mutex that serialises work on one repo@commit directory.
  Mutex& CommitMutex(const std::string& key) LLMCTL_EXCLUDES(mutex_);

  const HubOptions options_;  // constant after construction
  const http::HttpClient client_;
  InputCache* const cache_;

  Mutex mutex_;
  // Downloads in progress, keyed by repo, revision and file list: later callers wait for the
  // first one's result.
  std::map<std::string, InFlight> in_flight_ LLMCTL_GUARDED_BY(mutex_);
  std::map<std::string, std::unique_ptr<Mutex>> commit_mutexes_ LLMCTL_GUARDED_BY(mutex_);
};

}  // namespace llmctl::agent

#endif  // LLMCTL_AGENT_HUB_H_
