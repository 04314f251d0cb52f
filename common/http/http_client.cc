#include "common/http/http_client.h"

#include <curl/curl.h>

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <memory>
#include <mutex>
#include <random>
#include <thread>

#include "common/digest/digest.h"
#include "common/text.h"

namespace llmctl::http {
namespace {

std::string ToLower(std::string_view text) {
  std::string lower(text);
  for (char& c : lower) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return lower;
}

void InitCurlOnce() {
  static std::once_flag once;
  std::call_once(once, [] { curl_global_init(CURL_GLOBAL_DEFAULT); });
}

struct CurlDeleter {
  void operator()(CURL* curl) const { curl_easy_cleanup(curl); }
};
struct SlistDeleter {
  void operator()(curl_slist* list) const { curl_slist_free_all(list); }
};
struct FileCloser {
  void operator()(std::FILE* file) const { std::fclose(file); }
};

// What one transfer collects while libcurl runs it.
struct Transfer {
  CURL* curl = nullptr;
  Response response;
  // Downloads: where 200/206 bodies go, decided when the first body byte of the final answer
  // arrives.
  const std::string* download_path = nullptr;
  uint64_t resume_from = 0;
  std::unique_ptr<std::FILE, FileCloser> file;
  std::unique_ptr<digest::Sha256> sha256;
  bool body_to_file = false;
  bool body_mode_decided = false;
  size_t max_body_bytes = 0;
  uint64_t max_file_bytes = 0;  // 0: no bound
  std::string file_error;       // why the body could not be kept (a file's or memory's bound)
  const std::function<bool()>* cancelled = nullptr;
  bool was_cancelled = false;
};

// libcurl's progress callback, called about once a second even while nothing arrives: non-zero
// aborts the transfer (CURLE_ABORTED_BY_CALLBACK).
int OnProgress(void* user, curl_off_t, curl_off_t, curl_off_t, curl_off_t) {
  auto* transfer = static_cast<Transfer*>(user);
  if ((*transfer->cancelled)()) transfer->was_cancelled = true;
  return transfer->was_cancelled ? 1 : 0;
}

bool IsCancelled(const Request& request) { return request.cancelled && request.cancelled(); }

Status CancelledByCaller(const Request& request) {
  return CancelledError(request.method + " " + RedactUrl(request.url) +
                        ": cancelled by its caller");
}

size_t OnHeader(char* data, size_t size, size_t count, void* user) {
  auto* transfer = static_cast<Transfer*>(user);
  std::string_view line(data, size * count);
  while (!line.empty() && (line.back() == '\n' || line.back() == '\r')) line.remove_suffix(1);
  // A new status line starts the headers of a new answer (a redirect or 100-continue came first).
  if (line.starts_with("HTTP/")) {
    transfer->response.headers.Clear();
    return size * count;
  }
  size_t colon = line.find(':');
  if (colon == std::string_view::npos) return size * count;
  std::string_view value = line.substr(colon + 1);
  while (!value.empty() && (value.front() == ' ' || value.front() == '\t')) value.remove_prefix(1);
  transfer->response.headers.Add(std::string(line.substr(0, colon)), std::string(value));
  return size * count;
}

// Opens the download file for a 200 (rewrite) or 206 (append, hashing what is already there).
bool OpenDownload(Transfer& transfer, long status) {
  const std::string& path = *transfer.download_path;
  transfer.sha256 = std::make_unique<digest::Sha256>();
  if (status == 206) {
    std::unique_ptr<std::FILE, FileCloser> existing(std::fopen(path.c_str(), "rb"));
    if (!existing) {
      transfer.file_error = "cannot reread " + path;
      return false;
    }
    char buffer[1 << 16];
    size_t n;
    while ((n = std::fread(buffer, 1, sizeof buffer, existing.get())) > 0) {
      transfer.sha256->Update(std::string_view(buffer, n));
      transfer.response.file_size += n;
    }
    transfer.file.reset(std::fopen(path.c_str(), "ab"));
  } else {
    transfer.file.reset(std::fopen(path.c_str(), "wb"));
  }
  if (!transfer.file) {
    transfer.file_error = "cannot write " + path;
    return false;
  }
  return true;
}

size_t OnBody(char* data, size_t size, size_t count, void* user) {
  auto* transfer = static_cast<Transfer*>(user);
  size_t bytes = size * count;
  if (!transfer->body_mode_decided) {
    transfer->body_mode_decided = true;
    long status = 0;
    curl_easy_getinfo(transfer->curl, CURLINFO_RESPONSE_CODE, &status);
    bool resumed = status == 206 && transfer->resume_from > 0;
    if (transfer->download_path != nullptr && (status == 200 || resumed)) {
      transfer->body_to_file = true;
      if (!OpenDownload(*transfer, status)) return 0;  // 0 makes libcurl fail with a write error
    }
  }
  if (!transfer->body_to_file) {
    if (transfer->response.body.size() + bytes > transfer->max_body_bytes) {
      transfer->file_error = "the answer is larger than the " +
                             std::to_string(transfer->max_body_bytes) + " bytes read into memory";
      return 0;
    }
    transfer->response.body.append(data, bytes);
    return bytes;
  }
  if (transfer->max_file_bytes > 0 &&
      transfer->response.file_size + bytes > transfer->max_file_bytes) {
    transfer->file_error = "the file is larger than the " +
                           std::to_string(transfer->max_file_bytes) + " bytes announced for it";
    return 0;
  }
  if (std::fwrite(data, 1, bytes, transfer->file.get()) != bytes) {
    transfer->file_error = "short write to " + *transfer->download_path;
    return 0;
  }
  transfer->sha256->Update(std::string_view(data, bytes));
  transfer->response.file_size += bytes;
  return bytes;
}

Status TransportError(const Request& request, CURLcode code, const char* detail) {
  std::string message = request.method + " " + RedactUrl(request.url) + ": ";
  std::string reason = detail[0] != '\0' ? detail : curl_easy_strerror(code);
  switch (code) {
    case CURLE_OPERATION_TIMEDOUT:
      // libcurl's own words tell the two limits apart: "Operation too slow" is the stall limit.
      if (reason.find("too slow") != std::string::npos) {
        return Status(StatusCode::kDeadlineExceeded,
                      message + "stalled: under 1 byte a second for " +
                          std::to_string(request.stall_timeout.count()) + " s");
      }
      return Status(StatusCode::kDeadlineExceeded, message + "timed out (" + reason + ")");
    case CURLE_URL_MALFORMAT:
    case CURLE_UNSUPPORTED_PROTOCOL:
      return InvalidArgumentError(message + "bad URL (" + reason + ")");
    case CURLE_PEER_FAILED_VERIFICATION:
    case CURLE_SSL_CACERT_BADFILE:
    case CURLE_SSL_CERTPROBLEM:
      return FailedPreconditionError(message + "TLS verification failed (" + reason + ")");
    default:
      return UnavailableError(message + "connection failed (" + reason + ")");
  }
}

bool IsHttps(std::string_view url) {
  constexpr std::string_view kScheme = "https://";
  return url.size() >= kScheme.size() && EqualsIgnoreCase(url.substr(0, kScheme.size()), kScheme);
}

// libcurl's options for `request` on `c`: where, how long, which protocols and certificates, the
// method and body; the callbacks write into `transfer`, errors into `error_buffer`.
void SetTransferOptions(CURL* c, const Request& request, const std::string& ca_bundle_path,
                        char* error_buffer, Transfer& transfer) {
  curl_easy_setopt(c, CURLOPT_URL, request.url.c_str());
  curl_easy_setopt(c, CURLOPT_ERRORBUFFER, error_buffer);
  curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
  curl_easy_setopt(c, CURLOPT_PROTOCOLS_STR, "http,https");
  // An https request is never followed to plain http: its headers (an OpenStack token, a hub
  // token) and its answer would cross the network unencrypted.
  curl_easy_setopt(c, CURLOPT_REDIR_PROTOCOLS_STR, IsHttps(request.url) ? "https" : "http,https");
  curl_easy_setopt(c, CURLOPT_FOLLOWLOCATION, 1L);
  curl_easy_setopt(c, CURLOPT_MAXREDIRS, 5L);
  curl_easy_setopt(c, CURLOPT_SSL_VERIFYPEER, 1L);
  curl_easy_setopt(c, CURLOPT_SSL_VERIFYHOST, 2L);
  if (!ca_bundle_path.empty()) curl_easy_setopt(c, CURLOPT_CAINFO, ca_bundle_path.c_str());
  curl_easy_setopt(c, CURLOPT_CONNECTTIMEOUT_MS,
                   static_cast<long>(request.connect_timeout.count()));
  curl_easy_setopt(c, CURLOPT_TIMEOUT_MS, static_cast<long>(request.total_timeout.count()));
  if (request.stall_timeout.count() > 0) {
    // Under 1 byte a second averaged over the window: nothing, or next to nothing, arrived.
    curl_easy_setopt(c, CURLOPT_LOW_SPEED_LIMIT, 1L);
    curl_easy_setopt(c, CURLOPT_LOW_SPEED_TIME, static_cast<long>(request.stall_timeout.count()));
  }
  if (request.cancelled) {
    transfer.cancelled = &request.cancelled;
    curl_easy_setopt(c, CURLOPT_XFERINFOFUNCTION, OnProgress);
    curl_easy_setopt(c, CURLOPT_XFERINFODATA, &transfer);
    curl_easy_setopt(c, CURLOPT_NOPROGRESS, 0L);
  }
  curl_easy_setopt(c, CURLOPT_HEADERFUNCTION, OnHeader);
  curl_easy_setopt(c, CURLOPT_HEADERDATA, &transfer);
  curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, OnBody);
  curl_easy_setopt(c, CURLOPT_WRITEDATA, &transfer);
  if (request.method == "HEAD") {
    curl_easy_setopt(c, CURLOPT_NOBODY, 1L);
  } else if (request.method != "GET") {
    curl_easy_setopt(c, CURLOPT_CUSTOMREQUEST, request.method.c_str());
  }
  if (!request.body.empty() || request.method == "POST" || request.method == "PUT") {
    curl_easy_setopt(c, CURLOPT_POSTFIELDS, request.body.data());
    curl_easy_setopt(c, CURLOPT_POSTFIELDSIZE_LARGE, static_cast<curl_off_t>(request.body.size()));
  }
  transfer.max_body_bytes = request.max_body_bytes;
  transfer.max_file_bytes = request.max_file_bytes;
}

// The request's header lines. A download that has some of its file asks for the rest (Range),
// noting where it resumes in `transfer`.
std::unique_ptr<curl_slist, SlistDeleter> RequestHeaders(const Request& request,
                                                         Transfer& transfer) {
  std::unique_ptr<curl_slist, SlistDeleter> header_list;
  auto add_header = [&](const std::string& line) {
    header_list.reset(curl_slist_append(header_list.release(), line.c_str()));
  };
  for (const auto& [name, value] : request.headers.fields()) add_header(name + ": " + value);
  add_header("Expect:");  // no 100-continue round trip before bodies
  if (!request.download_path.empty()) {
    transfer.download_path = &request.download_path;
    std::error_code error;
    auto size = std::filesystem::file_size(request.download_path, error);
    if (!error && size > 0) {
      transfer.resume_from = size;
      add_header("Range: bytes=" + std::to_string(size) + "-");
    }
  }
  return header_list;
}

// The answer of a transfer that curl_easy_perform ended with `code`: the caller's cancellation, a
// body that could not be kept, the transport's error, else the response (a download's file
// flushed and hashed).
StatusOr<Response> FinishTransfer(const Request& request, Transfer& transfer, CURLcode code,
                                  const char* error_buffer) {
  if (transfer.was_cancelled) return CancelledByCaller(request);
  const std::string where = request.method + " " + RedactUrl(request.url) + ": ";
  if (!transfer.file_error.empty()) return DataLossError(where + transfer.file_error);
  if (code == CURLE_UNSUPPORTED_PROTOCOL && IsHttps(request.url)) {
    if (const std::optional<std::string> location = transfer.response.headers.Get("Location")) {
      return FailedPreconditionError(where + "refused its redirect to " + RedactUrl(*location) +
                                     ": an https request is not followed to plain http");
    }
  }
  if (code != CURLE_OK) return TransportError(request, code, error_buffer);
  long status = 0;
  curl_easy_getinfo(transfer.curl, CURLINFO_RESPONSE_CODE, &status);
  transfer.response.status = static_cast<int>(status);
  bool download_answer = transfer.download_path != nullptr &&
                         (status == 200 || (status == 206 && transfer.resume_from > 0));
  if (download_answer && !transfer.body_mode_decided) {
    // An empty body never reached OnBody: still rewrite (200) or rehash (206) the file.
    transfer.body_to_file = true;
    if (!OpenDownload(transfer, status)) return DataLossError(where + transfer.file_error);
  }
  if (transfer.body_to_file) {
    if (std::fflush(transfer.file.get()) != 0) {
      return DataLossError(where + "cannot flush " + request.download_path);
    }
    transfer.response.file_sha256 = transfer.sha256->HexDigest();
  }
  return std::move(transfer.response);
}

}  // namespace

void Headers::Add(std::string name, std::string value) {
  fields_.emplace_back(std::move(name), std::move(value));
}

std::optional<std::string> Headers::Get(std::string_view name) const {
  for (const auto& [field, value] : fields_) {
    if (EqualsIgnoreCase(field, name)) return value;
  }
  return std::nullopt;
}

HttpClient::HttpClient(ClientOptions options) : options_(std::move(options)) {
  InitCurlOnce();
  if (!options_.sleep) {
    options_.sleep = [](std::chrono::milliseconds delay) { std::this_thread::sleep_for(delay); };
  }
  if (!options_.random_unit) {
    options_.random_unit = [] {
      static std::mutex mutex;
      static std::mt19937_64 engine{std::random_device{}()};
      std::lock_guard<std::mutex> lock(mutex);
      return std::uniform_real_distribution<double>(0.0, 1.0)(engine);
    };
  }
}

std::chrono::milliseconds HttpClient::BackoffDelay(int failed_attempts) const {
  // Full jitter (a uniform draw below the exponential cap) spreads clients that failed together.
  auto cap = options_.retry.base_delay * (int64_t{1} << std::min(failed_attempts - 1, 20));
  cap = std::min(cap, options_.retry.max_delay);
  return std::chrono::milliseconds(
      static_cast<int64_t>(options_.random_unit() * static_cast<double>(cap.count())));
}

StatusOr<Response> HttpClient::Send(const Request& request) const {
  const bool may_retry = IsIdempotent(request.method);
  const int max_attempts = may_retry ? std::max(1, options_.retry.max_attempts) : 1;
  for (int attempt = 1;; ++attempt) {
    if (IsCancelled(request)) {
      return CancelledByCaller(request);
    }
    StatusOr<Response> result = SendOnce(request);
    bool retryable = result.ok() ? result->status >= 500
                                 : (result.status().code() == StatusCode::kUnavailable ||
                                    result.status().code() == StatusCode::kDeadlineExceeded);
    if (!retryable || attempt >= max_attempts) {
      if (!result.ok() && attempt > 1) {
        return result.status().WithContext("after " + std::to_string(attempt) + " attempts");
      }
      return result;
    }
    options_.sleep(BackoffDelay(attempt));
  }
}

StatusOr<Response> HttpClient::SendOnce(const Request& request) const {
  std::unique_ptr<CURL, CurlDeleter> curl(curl_easy_init());
  if (!curl) return InternalError("libcurl could not start a transfer");
  Transfer transfer;
  transfer.curl = curl.get();
  char error_buffer[CURL_ERROR_SIZE] = {};
  SetTransferOptions(curl.get(), request, options_.ca_bundle_path, error_buffer, transfer);
  const std::unique_ptr<curl_slist, SlistDeleter> headers = RequestHeaders(request, transfer);
  curl_easy_setopt(curl.get(), CURLOPT_HTTPHEADER, headers.get());
  const CURLcode code = curl_easy_perform(curl.get());
  return FinishTransfer(request, transfer, code, error_buffer);
}

bool IsIdempotent(std::string_view method) {
  return method == "GET" || method == "HEAD" || method == "PUT" || method == "DELETE";
}

std::string RedactUrl(std::string_view url) {
  std::string result(url);
  size_t scheme_end = result.find("://");
  size_t authority_start = scheme_end == std::string::npos ? 0 : scheme_end + 3;
  size_t authority_end = result.find_first_of("/?#", authority_start);
  if (authority_end == std::string::npos) authority_end = result.size();
  size_t at = result.rfind('@', authority_end);
  if (at != std::string::npos && at >= authority_start) {
    result.erase(authority_start, at + 1 - authority_start);
  }
  size_t query = result.find('?');
  if (query == std::string::npos) return result;
  std::string redacted = result.substr(0, query + 1);
  std::string_view rest = std::string_view(result).substr(query + 1);
  static constexpr std::string_view kSecretWords[] = {"token", "secret",    "password",
                                                      "key",   "signature", "sig"};
  bool first = true;
  while (true) {
    size_t end = rest.find('&');
    std::string_view pair = rest.substr(0, end);
    size_t eq = pair.find('=');
    std::string name = ToLower(pair.substr(0, eq));
    bool secret = std::any_of(std::begin(kSecretWords), std::end(kSecretWords),
                              [&](std::string_view word) { return name.find(word) != name.npos; });
    if (!first) redacted += '&';
    first = false;
    if (secret && eq != std::string_view::npos) {
      redacted += std::string(pair.substr(0, eq)) + "=REDACTED";
    } else {
      redacted += pair;
    }
    if (end == std::string_view::npos) break;
    rest.remove_prefix(end + 1);
  }
  return redacted;
}

Status ResponseError(const Request& request, const Response& response, std::string_view detail) {
  std::string message =
      request.method + " " + RedactUrl(request.url) + ": HTTP " + std::to_string(response.status);
  if (auto id = response.headers.Get("X-Openstack-Request-Id")) {
    message += " (request " + *id + ")";
  }
  if (!detail.empty()) message += ": " + std::string(detail);
  StatusCode code = StatusCode::kFailedPrecondition;
  switch (response.status) {
    case 400:
      code = StatusCode::kInvalidArgument;
      break;
    case 401:
      code = StatusCode::kUnauthenticated;
      break;
    case 403:
      code = StatusCode::kPermissionDenied;
      break;
    case 404:
      code = StatusCode::kNotFound;
      break;
    case 409:
      code = StatusCode::kAborted;
      break;
    case 429:
      code = StatusCode::kUnavailable;
      break;
    default:
      if (response.status >= 500) code = StatusCode::kUnavailable;
  }
  return Status(code, std::move(message));
}

std::string FormEncode(const std::vector<std::pair<std::string, std::string>>& fields) {
  std::string encoded;
  for (const auto& [name, value] : fields) {
    if (!encoded.empty()) encoded += '&';
    encoded += PercentEncode(name, /*keep_slash=*/false) + "=" +
               PercentEncode(value, /*keep_slash=*/false);
  }
  return encoded;
}

}  // namespace llmctl::http
