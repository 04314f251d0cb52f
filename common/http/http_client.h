// The project's one HTTP client (libcurl + OpenSSL): OpenStack APIs, Keystone, model-hub downloads.
//
// One request at a time per call, TLS verification always on. Idempotent methods (GET, HEAD, PUT,
// DELETE) are retried on 5xx answers, connect errors and timeouts with exponential backoff and full
// jitter; POST and PATCH are never re-sent, because the server may have acted on the first one.
#ifndef LLMCTL_COMMON_HTTP_HTTP_CLIENT_H_
#define LLMCTL_COMMON_HTTP_HTTP_CLIENT_H_

#include <chrono>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "common/status.h"

namespace llmctl::http {

// Header fields in arrival order; names compare case-insensitively, as HTTP says.
class Headers {
 public:
  void Add(std::string name, std::string value);
  // The first value of `name`, or nullopt.
  std::optional<std::string> Get(std::string_view name) const;
  const std::vector<std::pair<std::string, std::string>>& fields() const { return fields_; }
  void Clear() { fields_.clear(); }

 private:
  std::vector<std::pair<std::string, std::string>> fields_;
};

struct Request {
  std::string method = "GET";
  std::string url;
  Headers headers;
  std::string body;
  std::chrono::milliseconds connect_timeout{std::chrono::seconds(10)};
  std::chrono::milliseconds total_timeout{std::chrono::seconds(60)};
  // When set, a 200/206 body goes to this file instead of Response::body. A file already there is
  // resumed with "Range: bytes=<size>-"; a server that answers 200 instead of 206 rewrites it.
  std::string download_path;
  // A body kept in memory (Response::body) past this many bytes fails the call (DataLoss) instead
  // of growing for as long as the server sends: the answers read into memory here (OpenStack's,
  // the Hugging Face hub's listings, error pages) are JSON or text of at most a few MB.
  size_t max_body_bytes = size_t{64} << 20;
  // A download whose whole file would pass this many bytes fails the call (DataLoss); 0: no bound.
  // The size a listing announced, so that a server that sends on fills no disk.
  uint64_t max_file_bytes = 0;
  // A transfer that receives under 1 byte a second for this long fails (DeadlineExceeded, retried
  // like a timeout) instead of waiting out total_timeout, which for a large download is hours;
  // 0: none.
  std::chrono::seconds stall_timeout{0};
  // Asked about once a second while a transfer runs and before each retry: true ends the call
  // with Cancelled (never retried). For a caller that has given up, such as a gRPC call whose
  // client cancelled it. Called on the sending thread.
  std::function<bool()> cancelled;
};

struct Response {
  int status = 0;
  Headers headers;
  std::string body;  // empty for a download that succeeded
  // Downloads only: the size of the whole file and the lowercase hex sha256 of all of its bytes,
  // the part written by an earlier, interrupted call included.
  uint64_t file_size = 0;
  std::string file_sha256;
};

struct RetryPolicy {
  int max_attempts = 4;  // the first try included
  std::chrono::milliseconds base_delay{500};
  std::chrono::milliseconds max_delay{std::chrono::seconds(8)};
};

struct ClientOptions {
  std::string ca_bundle_path;  // empty: the system's CA store
  RetryPolicy retry;
  // Seams for tests: how to wait between attempts and where jitter comes from (a value in [0, 1)).
  std::function<void(std::chrono::milliseconds)> sleep;
  std::function<double()> random_unit;
};

class HttpClient {
 public:
  explicit HttpClient(ClientOptions options = {});

  // Sends `request`, retrying as the file comment says. Any HTTP answer is OK here, 4xx and 5xx
  // included (after the retries), so the caller can read the service's own error; use
  // ResponseError to turn one into a Status. A transport failure is Unavailable (connection),
  // DeadlineExceeded (timeout or stall), Cancelled (Request::cancelled) or InvalidArgument (a
  // malformed URL or unusable download path).
  StatusOr<Response> Send(const Request& request) const;

 private:
  StatusOr<Response> SendOnce(const Request& request) const;
  std::chrono::milliseconds BackoffDelay(int failed_attempts) const;

  ClientOptions options_;  // constant after construction
};

// Whether a method may be sent twice with the same effect as once.
bool IsIdempotent(std::string_view method);

// `url` with any user:password@ removed and the values of query parameters that look secret
// (token, secret, password, key, signature) replaced by "REDACTED": safe for messages and logs.
std::string RedactUrl(std::string_view url);

// "POST https://host/v1/leases: HTTP 409 (request req-123): <detail>", with a code that matches the
// status (400 InvalidArgument, 401 Unauthenticated, 403 PermissionDenied, 404 NotFound, 409
// Aborted, 429 and 5xx Unavailable, other 4xx FailedPrecondition).
Status ResponseError(const Request& request, const Response& response, std::string_view detail);

// "a=1&b=x%20y": application/x-www-form-urlencoded, for OAuth token endpoints and query strings.
std::string FormEncode(const std::vector<std::pair<std::string, std::string>>& fields);

}  // namespace llmctl::http

#endif  // LLMCTL_COMMON_HTTP_HTTP_CLIENT_H_
