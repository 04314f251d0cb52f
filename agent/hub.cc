#include "agent/hub.h"

#include <fcntl.h>
#include <stdio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "agent/hub_listing.h"
#include "common/atomic_file.h"
#include "common/checked_math.h"
#include "common/digest/digest.h"
#include "common/files.h"
#include "common/text.h"

namespace llmctl::agent {
namespace {

namespace fs = std::filesystem;

constexpr std::chrono::milliseconds kListingTimeout = std::chrono::minutes(1);
// One file's whole transfer; a transfer cut off by it is resumed by the client's next attempt.
constexpr std::chrono::milliseconds kFileTimeout = std::chrono::hours(2);
constexpr char kSingleWeightsFile[] = "model.safetensors";
constexpr const char* kOptionalDefaultFiles[] = {"generation_config.json", "tokenizer.json",
                                                 "tokenizer_config.json", "special_tokens_map.json",
                                                 "tokenizer.model"};

// Digests of a file on disk: its sha256 and its git blob id.
struct FileDigests {
  std::string sha256;
  std::string git_blob_id;
};

StatusOr<FileDigests> HashFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::error_code error;
  const auto size = fs::file_size(path, error);
  if (!in || error) return UnavailableError("cannot read " + path);
  digest::Sha256 sha256;
  digest::GitBlobId git_blob_id(size);
  std::string buffer(1 << 16, '\0');
  while (in) {
    in.read(buffer.data(), static_cast<std::streamsize>(buffer.size()));
    const std::string_view data(buffer.data(), static_cast<size_t>(in.gcount()));
    sha256.Update(data);
    git_blob_id.Update(data);
  }
  return FileDigests{sha256.HexDigest(), git_blob_id.HexDigest()};
}

std::string Describe(const HubModelRef& ref) { return ref.repo + "@" + ref.revision; }

// The hub's answer as a Status with a message that says what to do. huggingface_hub reads the
// same X-Error-Code values; the hub answers 401 for a repository it will not admit exists to an
// anonymous caller, so that is "not found" too unless a token was sent.
Status HubError(const HubModelRef& ref, const std::string& endpoint, bool has_token,
                const std::string& file, const http::Request& request,
                const http::Response& response) {
  const std::string code = response.headers.Get("X-Error-Code").value_or("");
  const std::string token_hint =
      has_token ? "" : " (a private or gated repository needs HF_TOKEN in the agent's environment)";
  if (code == "RepositoryNotFound" || (response.status == 401 && !has_token) ||
      (response.status == 404 && code.empty() && file.empty())) {
    return NotFoundError("Hugging Face model " + ref.repo + " not found at " + endpoint +
                         token_hint);
  }
  if (code == "RevisionNotFound") {
    return NotFoundError("revision '" + ref.revision + "' not found in Hugging Face model " +
                         ref.repo);
  }
  if (code == "EntryNotFound" || (response.status == 404 && !file.empty())) {
    return NotFoundError("Hugging Face model " + Describe(ref) + " has no file " + file);
  }
  if (code == "GatedRepo" || response.status == 403) {
    return Status(StatusCode::kPermissionDenied,
                  "Hugging Face model " + ref.repo +
                      " is gated: accept its terms on the hub with the account whose HF_TOKEN the "
                      "agent uses" +
                      token_hint);
  }
  if (response.status == 401) {
    return Status(StatusCode::kUnauthenticated,
                  "the hub at " + endpoint + " refused the agent's HF_TOKEN for " + ref.repo);
  }
  return http::ResponseError(request, response,
                             response.headers.Get("X-Error-Message").value_or(""));
}

// The shard files model.safetensors.index.json names in its weight_map, sorted.
StatusOr<std::vector<std::string>> IndexShards(const std::string& index_path,
                                               const std::string& what) {
  // Llama 3.1 405B's index is 97 KB; the file came from the hub, which any repository can fill.
  ASSIGN_OR_RETURN(const std::string text, ReadFileToString(index_path, size_t{64} << 20));
  return ParseIndexShards(text, what);
}

// Every regular file under `dir`, as paths relative to it.
std::vector<std::string> FilesUnder(const fs::path& dir) {
  std::vector<std::string> files;
  std::error_code error;
  for (auto it = fs::recursive_directory_iterator(dir, error);
       !error && it != fs::recursive_directory_iterator(); it.increment(error)) {
    if (it->is_regular_file(error)) files.push_back(fs::relative(it->path(), dir, error).string());
  }
  return files;
}

Status LinkInto(const std::string& source, const fs::path& target) {
  std::error_code error;
  fs::create_directories(target.parent_path(), error);
  if (error) return UnavailableError("cannot create " + target.parent_path().string());
  if (::link(source.c_str(), target.c_str()) != 0) {
    return UnavailableError("cannot link " + source + " to " + target.string() + ": " +
                            std::strerror(errno));
  }
  return Status::Ok();
}

Status CheckRequestedFiles(const std::vector<std::string>& requested) {
  for (const std::string& file : requested) {
    if (!IsSafeRelativePath(file)) {
      return InvalidArgumentError("files: '" + file +
                                  "' is not a relative path inside the repository");
    }
  }
  return Status::Ok();
}

// The hub's listing of the revision `ref` names: its commit and files. `base`: what every request
// of one download shares (the token, the stall limit, the callers' cancellation).
StatusOr<HubListing> ListRevision(const HubOptions& options, const http::HttpClient& client,
                                  const HubModelRef& ref, const http::Request& base) {
  http::Request request = base;
  request.url = options.endpoint + "/api/models/" + ref.repo + "/revision/" +
                PercentEncode(ref.revision, /*keep_slash=*/false) + "?blobs=true";
  request.total_timeout = kListingTimeout;
  ASSIGN_OR_RETURN(const http::Response response, client.Send(request));
  if (response.status != 200) {
    return HubError(ref, options.endpoint, !options.token.empty(), "", request, response);
  }
  return ParseHubListing(response.body, "Hugging Face model " + Describe(ref));
}

// One Download's transfers: files of one listed revision into the cache's blobs, each checked
// against the listing's size and digest.
class RevisionDownload {
 public:
  RevisionDownload(const HubOptions& options, const http::HttpClient& client, InputCache& cache,
                   const HubModelRef& ref, const HubListing& listing, http::Request base)
      : options_(options),
        client_(client),
        cache_(cache),
        ref_(ref),
        listing_(listing),
        base_(std::move(base)),
        what_("Hugging Face model " + ref.repo + "@" + listing.commit) {}

  // Path in the model directory -> where its bytes are now: the files `model_dir` holds already,
  // and the `requested` ones (none: config.json, the tokenizer's and the safetensors weights)
  // fetched into blobs.
  StatusOr<std::map<std::string, std::string>> Sources(const fs::path& model_dir,
                                                       const std::vector<std::string>& requested) {
    for (const std::string& path : FilesUnder(model_dir)) {
      sources_[path] = (model_dir / path).string();
    }
    if (!requested.empty()) {
      RETURN_IF_ERROR(CheckRoomForDownloads(requested));
      for (const std::string& path : requested) RETURN_IF_ERROR(Want(path));
    } else {
      RETURN_IF_ERROR(WantDefaultFiles());
    }
    return sources_;
  }

 private:
  bool Listed(const std::string& path) const { return listing_.files.count(path) > 0; }

  Status Want(const std::string& path) {
    if (sources_.count(path) > 0) return Status::Ok();
    ASSIGN_OR_RETURN(sources_[path], Fetch(path));
    return Status::Ok();
  }

  Status WantDefaultFiles() {
    if (!Listed("config.json")) {
      return FailedPreconditionError(what_ + " has no config.json: it is not a transformers model");
    }
    RETURN_IF_ERROR(Want("config.json"));
    for (const char* optional : kOptionalDefaultFiles) {
      if (Listed(optional)) RETURN_IF_ERROR(Want(optional));
    }
    if (Listed(kHubIndexFile)) {
      RETURN_IF_ERROR(Want(kHubIndexFile));
      ASSIGN_OR_RETURN(const std::vector<std::string> shards,
                       IndexShards(sources_[kHubIndexFile], what_));
      RETURN_IF_ERROR(CheckRoomForDownloads(shards));
      for (const std::string& shard : shards) RETURN_IF_ERROR(Want(shard));
      return Status::Ok();
    }
    if (Listed(kSingleWeightsFile)) {
      RETURN_IF_ERROR(CheckRoomForDownloads({kSingleWeightsFile}));
      return Want(kSingleWeightsFile);
    }
    return FailedPreconditionError(what_ + " has no safetensors weights (" + kSingleWeightsFile +
                                   " or " + kHubIndexFile + "); llmctl loads safetensors only");
  }

  // The same name on every attempt, so that the next call resumes what this one left.
  std::string PartialPath(const std::string& path) const {
    return cache_.dir() + "/tmp/hub-" +
           digest::Sha256Hex(ref_.repo + "@" + listing_.commit + "/" + path) + ".part";
  }

  // Whether what is left to download of `paths` (their listed sizes, less the files the model
  // directory or the cache hold and what earlier partial downloads left) fits in the cache:
  // checked before the first byte, so that weights too large for the node's disk are refused at
  // once, not after filling it.
  Status CheckRoomForDownloads(const std::vector<std::string>& paths) const {
    int64_t left = 0;
    for (const std::string& path : paths) {
      const auto listed = listing_.files.find(path);
      if (sources_.count(path) > 0 || listed == listing_.files.end()) continue;
      const HubFile& file = listed->second;
      if (!file.lfs_sha256.empty() && cache_.HasBlob(file.lfs_sha256)) continue;
      std::error_code error;
      const auto have = fs::file_size(PartialPath(path), error);
      const int64_t partial = error ? 0 : static_cast<int64_t>(have);
      left = SaturatingAdd(left, std::max<int64_t>(file.size - partial, 0));
    }
    return cache_.CheckRoom("downloading " + what_, left);
  }

  // One file into the cache's blobs (unless it is there already); returns its blob path.
  StatusOr<std::string> Fetch(const std::string& path) {
    const auto listed = listing_.files.find(path);
    if (listed == listing_.files.end()) return NotFoundError(what_ + " has no file " + path);
    const HubFile& file = listed->second;
    if (!file.lfs_sha256.empty() && cache_.HasBlob(file.lfs_sha256)) {
      return cache_.BlobPath(file.lfs_sha256);
    }
    const std::string partial = PartialPath(path);
    std::error_code error;
    const auto have = fs::file_size(partial, error);
    const int64_t kept = error ? 0 : static_cast<int64_t>(have);  // an earlier call's part
    bool complete = !error && kept == file.size;
    if (kept > file.size) fs::remove(partial, error);
    if (file.size == 0 && !complete) {
      // Nothing to download (and a cap of 0 bytes would be none).
      RETURN_IF_ERROR(WriteFileAtomically(partial, [](int) { return Status::Ok(); }));
      complete = true;
    }
    std::string sha256;
    if (!complete) {
      RETURN_IF_ERROR(cache_.CheckRoom(what_ + ": " + path, file.size - std::min(kept, file.size)));
      ASSIGN_OR_RETURN(sha256, Transfer(path, file, partial));
    }
    // Small files (no LFS digest) are checked against their git blob id, which needs another
    // pass; so does a partial file found complete.
    if (complete || file.lfs_sha256.empty()) {
      ASSIGN_OR_RETURN(sha256, Rehash(path, file, partial));
    }
    if (!file.lfs_sha256.empty() && sha256 != file.lfs_sha256) {
      fs::remove(partial, error);
      return DataLossError(what_ + ": " + path + " has sha256 " + sha256 + ", the hub lists " +
                           file.lfs_sha256 + "; the download was discarded");
    }
    RETURN_IF_ERROR(cache_.AdoptBlob(partial, sha256));
    return cache_.BlobPath(sha256);
  }

  // Downloads the rest of `path` into `partial`; the whole file's sha256.
  StatusOr<std::string> Transfer(const std::string& path, const HubFile& file,
                                 const std::string& partial) {
    http::Request request = base_;
    request.url = options_.endpoint + "/" + ref_.repo + "/resolve/" + listing_.commit + "/" +
                  PercentEncode(path, /*keep_slash=*/true);
    request.total_timeout = kFileTimeout;
    request.download_path = partial;
    request.max_file_bytes = static_cast<uint64_t>(file.size);  // > 0: Fetch writes empty files
    ASSIGN_OR_RETURN(const http::Response response, client_.Send(request));
    std::error_code error;
    if (response.status != 200 && response.status != 206) {
      if (response.status == 416) fs::remove(partial, error);  // a stale partial file
      return HubError(ref_, options_.endpoint, !options_.token.empty(), path, request, response);
    }
    if (static_cast<int64_t>(response.file_size) != file.size) {
      fs::remove(partial, error);
      return DataLossError(what_ + ": " + path + " arrived with " +
                           std::to_string(response.file_size) + " bytes, the hub lists " +
                           std::to_string(file.size) + "; the download was discarded");
    }
    return response.file_sha256;
  }

  // `partial`'s sha256, read again, after its git blob id is checked when the hub lists one for
  // a file without an LFS digest.
  StatusOr<std::string> Rehash(const std::string& path, const HubFile& file,
                               const std::string& partial) {
    ASSIGN_OR_RETURN(const FileDigests digests, HashFile(partial));
    if (file.lfs_sha256.empty() && !file.git_blob_id.empty() &&
        digests.git_blob_id != file.git_blob_id) {
      std::error_code error;
      fs::remove(partial, error);
      return DataLossError(what_ + ": " + path + " has git blob id " + digests.git_blob_id +
                           ", the hub lists " + file.git_blob_id + "; the download was discarded");
    }
    return digests.sha256;
  }

  const HubOptions& options_;
  const http::HttpClient& client_;
  InputCache& cache_;
  const HubModelRef& ref_;
  const HubListing& listing_;
  const http::Request base_;
  const std::string what_;
  std::map<std::string, std::string> sources_;
};

// Makes `model_dir` hold exactly `sources` (path -> where its bytes are) unless it does already:
// assembled beside the cache and swapped in whole, so a reader sees the old set or the new one.
Status InstallModelDir(InputCache& cache, const std::map<std::string, std::string>& sources,
                       const fs::path& model_dir, const std::string& commit) {
  if (FilesUnder(model_dir).size() == sources.size()) return Status::Ok();
  std::error_code error;
  const std::string staging = cache.TempPath("hub-" + commit);
  for (const auto& [path, source] : sources) {
    if (Status linked = LinkInto(source, fs::path(staging) / path); !linked.ok()) {
      fs::remove_all(staging, error);
      return linked;
    }
  }
  fs::create_directories(model_dir.parent_path(), error);
  if (::rename(staging.c_str(), model_dir.c_str()) == 0) return Status::Ok();
  // An older, smaller set is there: exchange the two atomically, then drop the old one.
  if ((errno != EEXIST && errno != ENOTEMPTY) ||
      ::renameat2(AT_FDCWD, staging.c_str(), AT_FDCWD, model_dir.c_str(), RENAME_EXCHANGE) != 0) {
    const std::string message =
        "cannot move " + staging + " to " + model_dir.string() + ": " + std::strerror(errno);
    fs::remove_all(staging, error);
    return UnavailableError(message);
  }
  fs::remove_all(staging, error);
  return Status::Ok();
}

// refs/<revision> in the repository's directory: the commit a branch or tag named when it was
// prepared, for Find.
Status RecordRevision(const std::string& repo_dir, const std::string& revision,
                      const std::string& commit) {
  const fs::path ref_file =
      fs::path(repo_dir) / "refs" / PercentEncode(revision, /*keep_slash=*/false);
  std::error_code error;
  fs::create_directories(ref_file.parent_path(), error);
  return WriteFileAtomically(ref_file.string(),
                             [&](int fd) { return WriteAll(fd, commit.data(), commit.size()); });
}

}  // namespace

HubOptions HubOptionsFromEnvironment() {
  HubOptions options;
  if (const char* endpoint = std::getenv("HF_ENDPOINT"); endpoint != nullptr && *endpoint) {
    options.endpoint = endpoint;
  }
  while (options.endpoint.ends_with('/')) options.endpoint.pop_back();
  if (const char* token = std::getenv("HF_TOKEN"); token != nullptr) options.token = token;
  return options;
}

HubCache::HubCache(HubOptions options, InputCache* cache)
    : options_(std::move(options)), client_(options_.http), cache_(cache) {}

std::string HubCache::RepoDir(const std::string& repo) const {
  return cache_->dir() + "/hub/" + repo;
}

Mutex& HubCache::CommitMutex(const std::string& key) {
  MutexLock lock(mutex_);
  std::unique_ptr<Mutex>& slot = commit_mutexes_[key];
  if (!slot) slot = std::make_unique<Mutex>();
  return *slot;
}

StatusOr<PreparedModel> HubCache::Prepare(const HubModelRef& ref,
                                          const std::vector<std::string>& files,
                                          const std::function<bool()>& cancelled) {
  std::string key = ref.repo + "\n" + ref.revision;
  for (const std::string& file : files) key += "\n" + file;
  std::promise<StatusOr<PreparedModel>> promise;
  std::shared_future<StatusOr<PreparedModel>> running;
  {
    MutexLock lock(mutex_);
    auto [it, first] = in_flight_.try_emplace(key);
    it->second.callers.push_back(&cancelled);
    if (first) {
      it->second.result = promise.get_future().share();
    } else {
      running = it->second.result;
    }
  }
  if (running.valid()) return AwaitDownload(key, running, cancelled);

  StatusOr<PreparedModel> result = InternalError("the download of " + Describe(ref) + " failed");
  try {
    result = Download(ref, files, [this, &key] { return EveryCallerCancelled(key); });
  } catch (const std::exception& error) {  // the waiters must hear back whatever happens
    result = InternalError("preparing " + Describe(ref) + ": " + error.what());
  }
  promise.set_value(result);
  MutexLock lock(mutex_);
  in_flight_.erase(key);
  return result;
}

StatusOr<PreparedModel> HubCache::AwaitDownload(
    const std::string& key, const std::shared_future<StatusOr<PreparedModel>>& running,
    const std::function<bool()>& cancelled) {
  while (running.wait_for(std::chrono::seconds(1)) != std::future_status::ready) {
    if (!cancelled || !cancelled()) continue;
    MutexLock lock(mutex_);
    if (auto it = in_flight_.find(key); it != in_flight_.end()) {
      std::erase(it->second.callers, &cancelled);
    }
    return CancelledError(
        "preparing the model: cancelled by its caller; the download goes on for "
        "the other callers waiting for it");
  }
  return running.get();
}

bool HubCache::EveryCallerCancelled(const std::string& key) {
  MutexLock lock(mutex_);
  auto it = in_flight_.find(key);
  if (it == in_flight_.end()) return false;
  return std::all_of(
      it->second.callers.begin(), it->second.callers.end(),
      [](const std::function<bool()>* cancelled) { return *cancelled && (*cancelled)(); });
}

StatusOr<PreparedModel> HubCache::Download(const HubModelRef& ref,
                                           const std::vector<std::string>& requested,
                                           std::function<bool()> cancelled) {
  RETURN_IF_ERROR(CheckRequestedFiles(requested));
  // What every request of this download shares.
  http::Request base;
  if (!options_.token.empty()) base.headers.Add("Authorization", "Bearer " + options_.token);
  base.stall_timeout = options_.stall_timeout;
  base.cancelled = std::move(cancelled);
  ASSIGN_OR_RETURN(const HubListing listing, ListRevision(options_, client_, ref, base));

  MutexLock commit_lock(CommitMutex(ref.repo + "@" + listing.commit));
  const fs::path model_dir = fs::path(RepoDir(ref.repo)) / listing.commit;
  RevisionDownload download(options_, client_, *cache_, ref, listing, std::move(base));
  ASSIGN_OR_RETURN(const auto sources, download.Sources(model_dir, requested));
  RETURN_IF_ERROR(InstallModelDir(*cache_, sources, model_dir, listing.commit));
  if (ref.revision != listing.commit) {
    RETURN_IF_ERROR(RecordRevision(RepoDir(ref.repo), ref.revision, listing.commit));
  }
  PreparedModel prepared{model_dir.string(), listing.commit, 0};
  std::error_code error;
  for (const std::string& path : FilesUnder(model_dir)) {
    prepared.bytes += static_cast<int64_t>(fs::file_size(model_dir / path, error));
  }
  return prepared;
}

StatusOr<std::string> HubCache::Find(const HubModelRef& ref) const {
  std::string commit = ref.revision;
  if (!IsCommitHex(commit)) {
    auto text = ReadFileToString(RepoDir(ref.repo) + "/refs/" +
                                 PercentEncode(ref.revision, /*keep_slash=*/false));
    commit = text.ok() ? *text : "";
  }
  const std::string dir = RepoDir(ref.repo) + "/" + commit;
  std::error_code error;
  if (!IsCommitHex(commit) || !fs::is_regular_file(dir + "/config.json", error)) {
    return FailedPreconditionError("model " + HubModelRefText(ref) +
                                   " not prepared on this node (PrepareHubModel downloads it)");
  }
  return dir;
}

}  // namespace llmctl::agent
