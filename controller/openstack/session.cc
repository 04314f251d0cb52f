#include "controller/openstack/session.h"

#include <openssl/evp.h>

#include <algorithm>
#include <set>

#include "common/foreign_json.h"
#include "common/text.h"

namespace llmctl::openstack {
namespace {

using nlohmann::json;

const std::vector<std::string_view> kBlockStorageTypes = {"block-storage", "volumev3", "volumev2",
                                                          "volume", "block-store"};

std::vector<std::string_view> TypeAliases(std::string_view type) {
  if (std::find(kBlockStorageTypes.begin(), kBlockStorageTypes.end(), type) !=
      kBlockStorageTypes.end()) {
    return kBlockStorageTypes;
  }
  return {type};
}

std::string Base64(std::string_view bytes) {
  std::string out(4 * ((bytes.size() + 2) / 3), '\0');
  int length = EVP_EncodeBlock(reinterpret_cast<unsigned char*>(out.data()),
                               reinterpret_cast<const unsigned char*>(bytes.data()),
                               static_cast<int>(bytes.size()));
  out.resize(static_cast<size_t>(length));
  return out;
}

std::string JoinUrl(std::string base, std::string_view path) {
  while (base.ends_with('/')) base.pop_back();
  if (!path.empty() && path.front() != '/') base += '/';
  return base + std::string(path);
}

json ProjectScope(const Credentials& creds) {
  json project;
  if (!creds.project_id.empty()) {
    project["id"] = creds.project_id;
  } else {
    project["name"] = creds.project_name;
    if (!creds.project_domain_id.empty()) {
      project["domain"]["id"] = creds.project_domain_id;
    } else if (!creds.project_domain_name.empty()) {
      project["domain"]["name"] = creds.project_domain_name;
    } else {
      project["domain"]["id"] = "default";  // keystoneauth's default domain
    }
  }
  return {{"project", project}};
}

json UserIdentity(const Credentials& creds) {
  json user;
  if (!creds.user_id.empty()) {
    user["id"] = creds.user_id;
  } else {
    user["name"] = creds.username;
    if (!creds.user_domain_id.empty()) {
      user["domain"]["id"] = creds.user_domain_id;
    } else if (!creds.user_domain_name.empty()) {
      user["domain"]["name"] = creds.user_domain_name;
    } else {
      user["domain"]["id"] = "default";
    }
  }
  return user;
}

}  // namespace

StatusOr<Catalog> Catalog::FromJson(const json& catalog) {
  if (!catalog.is_array()) return InvalidArgumentError("token catalog is not a list");
  Catalog result;
  for (const json& service : catalog) {
    if (!service.is_object() || !service.contains("type") || !service["type"].is_string() ||
        !service.contains("endpoints") || !service["endpoints"].is_array()) {
      return InvalidArgumentError("token catalog entry without a type and endpoints: " +
                                  OnOneLine(service.dump(), 200));
    }
    for (const json& endpoint : service["endpoints"]) {
      if (!endpoint.is_object() || !endpoint.contains("url") || !endpoint["url"].is_string()) {
        return InvalidArgumentError("catalog endpoint of " + service["type"].get<std::string>() +
                                    " without a url");
      }
      auto text = [&](const char* key) {
        return endpoint.contains(key) && endpoint[key].is_string()
                   ? endpoint[key].get<std::string>()
                   : std::string();
      };
      std::string region = text("region_id");
      if (region.empty()) region = text("region");
      result.endpoints_.push_back(
          {service["type"].get<std::string>(), text("interface"), region, text("url")});
    }
  }
  return result;
}

StatusOr<std::string> Catalog::Url(std::string_view service_type, std::string_view interface,
                                   std::string_view region) const {
  std::vector<std::string_view> types = TypeAliases(service_type);
  // Aliases in preference order: the first type with a matching endpoint wins.
  for (std::string_view type : types) {
    std::set<std::string> urls;
    std::set<std::string> regions;
    for (const Endpoint& endpoint : endpoints_) {
      if (endpoint.type != type || endpoint.interface != interface) continue;
      regions.insert(endpoint.region);
      if (region.empty() || endpoint.region == region) urls.insert(endpoint.url);
    }
    if (urls.size() == 1) return *urls.begin();
    if (urls.size() > 1) {
      std::string list;
      for (const auto& name : regions) list += (list.empty() ? "" : ", ") + name;
      return FailedPreconditionError("the catalog has " + std::string(type) +
                                     " in several regions (" + list +
                                     "): set OS_REGION_NAME or region_name");
    }
  }
  std::set<std::string> offered;
  for (const Endpoint& endpoint : endpoints_) {
    if (endpoint.interface == interface && (region.empty() || endpoint.region == region)) {
      offered.insert(endpoint.type);
    }
  }
  std::string list;
  for (const auto& name : offered) list += (list.empty() ? "" : ", ") + name;
  return NotFoundError("the service catalog has no " + std::string(interface) + " " +
                       std::string(service_type) + " endpoint" +
                       (region.empty() ? "" : " in region " + std::string(region)) +
                       "; it offers: " + (list.empty() ? "nothing" : list));
}

StatusOr<Token> ParseTokenAnswer(const http::Response& response, const std::string& url,
                                 std::string_view what) {
  auto subject = response.headers.Get("X-Subject-Token");
  json body = ParseForeignJson(response.body);
  if (!subject || subject->empty() || !body.is_object() || !body.contains("token") ||
      !body["token"].is_object()) {
    return InternalError(std::string(what) + ": " + url +
                         " answered without a token (no X-Subject-Token header or token body)");
  }
  const json& token_json = body["token"];
  Token token;
  token.id = *subject;
  if (!token_json.contains("expires_at") || !token_json["expires_at"].is_string()) {
    return InternalError(std::string(what) + ": the token from " + url + " has no expires_at");
  }
  ASSIGN_OR_RETURN(token.expires_at,
                   ParseUtcTimestamp(token_json["expires_at"].get<std::string>()));
  if (token_json.contains("project") && token_json["project"].is_object() &&
      token_json["project"].contains("id") && token_json["project"]["id"].is_string()) {
    token.project_id = token_json["project"]["id"].get<std::string>();
  }
  if (token_json.contains("catalog")) {
    StatusOr<Catalog> catalog = Catalog::FromJson(token_json["catalog"]);
    if (!catalog.ok()) return catalog.status().WithContext(std::string(what) + ": " + url);
    token.catalog = std::move(*catalog);
  }
  return token;
}

Session::Session(Credentials credentials, const http::HttpClient& http, CloudClock& clock,
                 SessionOptions options)
    : credentials_(std::move(credentials)), http_(http), clock_(clock), options_(options) {}

std::string Session::Describe() const {
  std::string who;
  switch (credentials_.auth_type) {
    case AuthType::kApplicationCredential:
      who = "application credential " + (credentials_.application_credential_id.empty()
                                             ? credentials_.application_credential_name
                                             : credentials_.application_credential_id);
      break;
    case AuthType::kPassword:
      who = "password of user " +
            (credentials_.user_id.empty() ? credentials_.username : credentials_.user_id);
      break;
    case AuthType::kV3OidcPassword:
      who = "OIDC password of " + credentials_.username + " via " + credentials_.identity_provider;
      break;
  }
  return "authenticating to " + credentials_.auth_url + " with the " + who + " (" +
         credentials_.source + ")";
}

StatusOr<Token> Session::CurrentToken() {
  {
    MutexLock lock(mutex_);
    if (token_ && token_->expires_at - clock_.Now() > options_.refresh_margin) return *token_;
  }
  // Two threads may both authenticate here; the later token simply replaces the earlier one.
  ASSIGN_OR_RETURN(Token token, Authenticate());
  MutexLock lock(mutex_);
  token_ = token;
  return token;
}

StatusOr<Token> Session::IssueToken(const json& auth, const http::Headers& extra_headers,
                                    const std::string& url, std::string_view what) {
  http::Request request;
  request.method = "POST";
  request.url = url;
  request.connect_timeout = options_.connect_timeout;
  request.total_timeout = options_.request_timeout;
  request.headers = extra_headers;
  request.headers.Add("Content-Type", "application/json");
  request.headers.Add("Accept", "application/json");
  if (!auth.is_null()) request.body = auth.dump();
  ASSIGN_OR_RETURN(http::Response response, http_.Send(request));
  if (response.status != 201 && response.status != 200) {
    return ApiError(request, response).WithContext(what);
  }
  return ParseTokenAnswer(response, url, what);
}

StatusOr<std::string> Session::OidcAccessToken() {
  const std::string what = Describe();
  http::Request discovery;
  discovery.url = credentials_.discovery_endpoint;
  discovery.connect_timeout = options_.connect_timeout;
  discovery.total_timeout = options_.request_timeout;
  ASSIGN_OR_RETURN(http::Response document, http_.Send(discovery));
  if (document.status != 200) return ApiError(discovery, document).WithContext(what);
  json config = ParseForeignJson(document.body);
  if (!config.is_object() || !config.contains("token_endpoint") ||
      !config["token_endpoint"].is_string()) {
    return InvalidArgumentError(what + ": the OpenID configuration at " +
                                http::RedactUrl(discovery.url) + " names no token_endpoint");
  }
  http::Request login;
  login.method = "POST";
  login.url = config["token_endpoint"].get<std::string>();
  login.connect_timeout = options_.connect_timeout;
  login.total_timeout = options_.request_timeout;
  login.headers.Add("Content-Type", "application/x-www-form-urlencoded");
  // keystoneauth sends the client's id and secret as HTTP Basic credentials.
  login.headers.Add("Authorization",
                    "Basic " + Base64(credentials_.client_id + ":" + credentials_.client_secret));
  login.body = http::FormEncode({{"grant_type", "password"},
                                 {"username", credentials_.username},
                                 {"password", credentials_.password},
                                 {"scope", credentials_.openid_scope}});
  ASSIGN_OR_RETURN(http::Response answer, http_.Send(login));
  if (answer.status != 200) return ApiError(login, answer).WithContext(what);
  json tokens = ParseForeignJson(answer.body);
  if (!tokens.is_object() || !tokens.contains("access_token") ||
      !tokens["access_token"].is_string()) {
    return InvalidArgumentError(what + ": " + http::RedactUrl(login.url) +
                                " answered without an access_token");
  }
  return tokens["access_token"].get<std::string>();
}

StatusOr<Token> Session::Authenticate() {
  const std::string what = Describe();
  const std::string tokens_url = credentials_.auth_url + "/auth/tokens";
  json identity;
  switch (credentials_.auth_type) {
    case AuthType::kApplicationCredential: {
      json credential = {{"secret", credentials_.application_credential_secret}};
      if (!credentials_.application_credential_id.empty()) {
        credential["id"] = credentials_.application_credential_id;
      } else {
        credential["name"] = credentials_.application_credential_name;
        credential["user"] = UserIdentity(credentials_);
      }
      identity = {{"methods", {"application_credential"}}, {"application_credential", credential}};
      // Keystone refuses a scope with an application credential: it carries its own project.
      return IssueToken({{"auth", {{"identity", identity}}}}, {}, tokens_url, what);
    }
    case AuthType::kPassword: {
      json user = UserIdentity(credentials_);
      user["password"] = credentials_.password;
      identity = {{"methods", {"password"}}, {"password", {{"user", user}}}};
      return IssueToken({{"auth", {{"identity", identity}, {"scope", ProjectScope(credentials_)}}}},
                        {}, tokens_url, what);
    }
    case AuthType::kV3OidcPassword: {
      ASSIGN_OR_RETURN(std::string access_token, OidcAccessToken());
      http::Headers bearer;
      bearer.Add("Authorization", "Bearer " + access_token);
      ASSIGN_OR_RETURN(Token unscoped,
                       IssueToken(nullptr, bearer,
                                  credentials_.auth_url + "/OS-FEDERATION/identity_providers/" +
                                      credentials_.identity_provider + "/protocols/" +
                                      credentials_.protocol + "/auth",
                                  what));
      identity = {{"methods", {"token"}}, {"token", {{"id", unscoped.id}}}};
      return IssueToken({{"auth", {{"identity", identity}, {"scope", ProjectScope(credentials_)}}}},
                        {}, tokens_url, what + " (rescoping to the project)");
    }
  }
  return InternalError("unknown auth type");
}

StatusOr<std::string> Session::EndpointUrl(std::string_view service_type) {
  ASSIGN_OR_RETURN(Token token, CurrentToken());
  return token.catalog.Url(service_type, credentials_.interface, credentials_.region_name);
}

StatusOr<Exchange> Session::Call(std::string_view service_type, http::Request request) {
  const std::string path = request.url;
  for (int attempt = 1;; ++attempt) {
    ASSIGN_OR_RETURN(Token token, CurrentToken());
    ASSIGN_OR_RETURN(std::string base, token.catalog.Url(service_type, credentials_.interface,
                                                         credentials_.region_name));
    Exchange exchange;
    exchange.request = request;
    exchange.request.url = JoinUrl(base, path);
    exchange.request.headers.Add("X-Auth-Token", token.id);
    exchange.request.headers.Add("Accept", "application/json");
    if (!exchange.request.body.empty()) {
      exchange.request.headers.Add("Content-Type", "application/json");
    }
    ASSIGN_OR_RETURN(exchange.response, http_.Send(exchange.request));
    if (exchange.response.status == 401 && attempt == 1) {
      // Revoked or expired early: forget this token (unless another thread already did) and retry.
      MutexLock lock(mutex_);
      if (token_ && token_->id == token.id) token_.reset();
      continue;
    }
    return exchange;
  }
}

StatusOr<json> Session::CallJson(std::string_view service_type, std::string method,
                                 std::string path, const json* body, const http::Headers& headers) {
  http::Request request;
  request.method = std::move(method);
  request.url = std::move(path);
  request.headers = headers;
  request.connect_timeout = options_.connect_timeout;
  request.total_timeout = options_.request_timeout;
  if (body != nullptr) request.body = body->dump();
  ASSIGN_OR_RETURN(Exchange exchange, Call(service_type, std::move(request)));
  if (exchange.response.status < 200 || exchange.response.status >= 300) {
    return ApiError(exchange.request, exchange.response);
  }
  if (exchange.response.body.empty()) return json();
  json parsed = ParseForeignJson(exchange.response.body);
  if (parsed.is_discarded()) {
    return InternalError(exchange.request.method + " " + http::RedactUrl(exchange.request.url) +
                         ": the answer is not JSON: " + OnOneLine(exchange.response.body, 200));
  }
  return parsed;
}

std::string ServiceMessage(const http::Response& response) {
  json body = ParseForeignJson(response.body);
  auto text = [](const json& value, const char* key) -> std::string {
    if (value.is_object() && value.contains(key) && value[key].is_string()) {
      return value[key].get<std::string>();
    }
    return "";
  };
  if (body.is_object()) {
    // Blazar: {"error_message": ...}; OAuth: {"error_description": ...}.
    for (const char* key : {"error_message", "error_description", "message", "detail"}) {
      if (std::string found = text(body, key); !found.empty()) return found;
    }
    // Keystone {"error": {...}}, Nova {"itemNotFound": {...}}, Neutron {"NeutronError": {...}}.
    for (const auto& [key, value] : body.items()) {
      if (std::string found = text(value, "message"); !found.empty()) return found;
    }
    if (std::string found = text(body, "error"); !found.empty()) return found;
  }
  std::string raw = response.body.substr(0, 300);
  raw.erase(std::remove(raw.begin(), raw.end(), '\n'), raw.end());
  return raw;
}

Status ApiError(const http::Request& request, const http::Response& response) {
  return http::ResponseError(request, response, ServiceMessage(response));
}

}  // namespace llmctl::openstack
