// Keystone v3: tokens for the three ways Chameleon users log in, the service catalog, and
// authenticated calls to a service that re-issue the token before it expires and once after a 401.
#ifndef LLMCTL_CONTROLLER_OPENSTACK_SESSION_H_
#define LLMCTL_CONTROLLER_OPENSTACK_SESSION_H_

#include <chrono>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/http/http_client.h"
#include "common/mutex.h"
#include "common/status.h"
#include "controller/openstack/cloud_clock.h"
#include "controller/openstack/credentials.h"

namespace llmctl::openstack {

// The pages a paged list (Glance's images, Nova's flavors) may take: a server whose "next" links
// never end is refused after these, not followed for ever.
inline constexpr int kMaxListPages = 1000;

// The endpoints a token's catalog lists.
class Catalog {
 public:
  // From token.catalog; InvalidArgument when its shape is not Keystone's.
  static StatusOr<Catalog> FromJson(const nlohmann::json& catalog);

  // The URL of `service_type` for `interface` in `region` (any region when empty, if the service
  // has one). block-storage and its aliases (volumev3, volumev2, volume, block-store) find each
  // other. NotFound naming what the catalog does offer.
  StatusOr<std::string> Url(std::string_view service_type, std::string_view interface,
                            std::string_view region) const;

 private:
  struct Endpoint {
    std::string type, interface, region, url;
  };
  std::vector<Endpoint> endpoints_;
};

struct Token {
  std::string id;
  TimePoint expires_at;
  std::string project_id;
  Catalog catalog;
};

// A request as sent (absolute URL) and its answer, so errors can name both.
struct Exchange {
  http::Request request;
  http::Response response;
};

struct SessionOptions {
  // A token with less than this left is re-issued before use (keystoneauth's margin).
  std::chrono::seconds refresh_margin{120};
  std::chrono::milliseconds connect_timeout{std::chrono::seconds(10)};
  std::chrono::milliseconds request_timeout{std::chrono::seconds(60)};
};

// Thread-safe: the token is guarded; requests run outside the lock.
class Session {
 public:
  Session(Credentials credentials, const http::HttpClient& http, CloudClock& clock,
          SessionOptions options = {});

  // A token valid for at least the refresh margin, authenticating when needed. Errors say which
  // Keystone refused which identity, never with a secret in them.
  StatusOr<Token> CurrentToken();

  // The endpoint of `service_type` for the credentials' interface and region.
  StatusOr<std::string> EndpointUrl(std::string_view service_type);

  // Sends `request`, whose url is relative to the service's endpoint ("/leases"), with the token
  // and JSON headers. A 401 answer re-authenticates and sends once more. Any HTTP answer is OK;
  // ApiError turns one into a Status.
  StatusOr<Exchange> Call(std::string_view service_type, http::Request request);

  // Call, then the 2xx answer's JSON body (null for an empty body such as 204's), or ApiError.
  StatusOr<nlohmann::json> CallJson(std::string_view service_type, std::string method,
                                    std::string path, const nlohmann::json* body = nullptr,
                                    const http::Headers& headers = {});

  const Credentials& credentials() const { return credentials_; }
  const SessionOptions& options() const { return options_; }

 private:
  StatusOr<Token> Authenticate();
  StatusOr<Token> IssueToken(const nlohmann::json& auth, const http::Headers& extra_headers,
                             const std::string& url, std::string_view what);
  StatusOr<std::string> OidcAccessToken();
  std::string Describe() const;

  const Credentials credentials_;
  const http::HttpClient& http_;
  CloudClock& clock_;
  const SessionOptions options_;

  Mutex mutex_;
  std::optional<Token> token_ LLMCTL_GUARDED_BY(mutex_);
};

// Keystone's answer to a token request that it accepted (200 or 201): the token's id from the
// X-Subject-Token header, its expiry, project and catalog from the body. InternalError saying
// `what` and `url` when either is missing; InvalidArgument when the expiry is no UTC timestamp or
// the catalog not Keystone's shape.
StatusOr<Token> ParseTokenAnswer(const http::Response& response, const std::string& url,
                                 std::string_view what);

// The service's own message from an error body (Keystone, Nova, Neutron, Blazar and OAuth
// shapes), else the body itself, shortened.
std::string ServiceMessage(const http::Response& response);

// http::ResponseError with ServiceMessage as the detail.
Status ApiError(const http::Request& request, const http::Response& response);

}  // namespace llmctl::openstack

#endif  // LLMCTL_CONTROLLER_OPENSTACK_SESSION_H_
