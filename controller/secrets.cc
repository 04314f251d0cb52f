#include "controller/secrets.h"

#include <openssl/rand.h>
#include <spdlog/spdlog.h>
#include <sys/stat.h>

#include <nlohmann/json.hpp>
#include <vector>

#include "common/atomic_file.h"
#include "common/digest/digest.h"
#include "common/files.h"
#include "rpc/tls.h"

namespace llmctl::controller {

StatusOr<std::string> RandomHex(size_t bytes) {
  std::vector<unsigned char> random(bytes);
  if (RAND_bytes(random.data(), static_cast<int>(random.size())) != 1) {
    return InternalError("the system's random number generator failed");
  }
  static constexpr char kHex[] = "0123456789abcdef";
  std::string hex;
  for (unsigned char byte : random) {
    hex.push_back(kHex[byte >> 4]);
    hex.push_back(kHex[byte & 15]);
  }
  return hex;
}

StatusOr<std::string> NewNodeToken() { return RandomHex(32); }

std::string SecretsFile::NodeTokenRef(std::string_view node) {
  return "secrets.json#node_tokens/" + std::string(node);
}

StatusOr<std::unique_ptr<SecretsFile>> SecretsFile::Open(std::string path) {
  std::unique_ptr<SecretsFile> secrets(new SecretsFile(path));
  // A crash between writing a new version and renaming it leaves the temporary, tokens and all:
  // removed here, as the daemon holds its data directory alone (controller/daemon.cc).
  if (StatusOr<int> removed = RemoveAtomicWriteLeftovers(path); !removed.ok()) {
    spdlog::warn("secrets: leftover temporaries: {}", removed.status().ToString());
  } else if (*removed > 0) {
    spdlog::warn("secrets: removed {} temporaries a crash left beside {}", *removed, path);
  }
  struct stat info;
  if (stat(path.c_str(), &info) != 0) return secrets;  // created on the first change
  if ((info.st_mode & 077) != 0) {
    return FailedPreconditionError(path + " can be read by others; run chmod 600 on it");
  }
  ASSIGN_OR_RETURN(std::string text, ReadFileToString(path, 64 << 20));
  MutexLock lock(secrets->mutex_);  // not shared yet; held so the analysis sees the fields' rule
  try {
    const nlohmann::json json = nlohmann::json::parse(text);
    for (const auto& [node, token] : json.at("node_tokens").items()) {
      secrets->node_tokens_[node] = token.get<std::string>();
    }
    // Absent in files written before certificate names were kept.
    const nlohmann::json names = json.value("node_certificate_names", nlohmann::json::object());
    for (const auto& [node, name] : names.items()) {
      secrets->node_certificate_names_[node] = name.get<std::string>();
    }
    // Absent in files written before expiries were kept.
    const nlohmann::json expiry = json.value("node_certificate_expiry", nlohmann::json::object());
    for (const auto& [node, unix_time] : expiry.items()) {
      secrets->node_certificate_expiry_[node] = unix_time.get<int64_t>();
    }
    // Absent in files written before enrollment.
    const nlohmann::json enrollments = json.value("enrollments", nlohmann::json::object());
    for (const auto& [node, entry] : enrollments.items()) {
      // The sent grant is absent until one is sent, and in files written before it was kept.
      secrets->enrollments_[node] = {
          entry.at("token_sha256").get<std::string>(), entry.at("expires_unix").get<int64_t>(),
          entry.at("certificate_name").get<std::string>(), entry.value("sent_token", std::string()),
          entry.value("sent_certificate_pem", std::string())};
    }
  } catch (const nlohmann::json::parse_error& e) {
    // Where, never what: nlohmann's message quotes the text around the error, which holds tokens,
    // and the message goes to the daemon's log.
    return DataLossError(
        std::string(path).append(" is damaged: not JSON at byte ").append(std::to_string(e.byte)));
  } catch (const nlohmann::json::exception& e) {
    return DataLossError(std::string(path).append(
        " is damaged: an entry is missing or has the wrong type (JSON error " +
        std::to_string(e.id) + ")"));
  }
  return secrets;
}

Status SecretsFile::PutNodeToken(std::string_view node, std::string_view token,
                                 std::string_view certificate_name) {
  MutexLock lock(mutex_);
  node_tokens_[std::string(node)] = std::string(token);
  node_certificate_expiry_.erase(std::string(node));  // a new certificate's: set after this
  if (certificate_name.empty()) {
    node_certificate_names_.erase(std::string(node));
  } else {
    node_certificate_names_[std::string(node)] = std::string(certificate_name);
  }
  // New credentials replace a pending enrollment too: its token (which lives on in the cloud
  // server's user data for its hour) must not enroll the node over them.
  enrollments_.erase(std::string(node));
  return WriteLocked();
}

Status SecretsFile::RemoveNodeToken(std::string_view node) {
  MutexLock lock(mutex_);
  const bool had_token = node_tokens_.erase(std::string(node)) > 0;
  const bool had_name = node_certificate_names_.erase(std::string(node)) > 0;
  node_certificate_expiry_.erase(std::string(node));
  const bool had_enrollment = enrollments_.erase(std::string(node)) > 0;
  if (!had_token && !had_name && !had_enrollment) return Status::Ok();
  return WriteLocked();
}

StatusOr<std::string> SecretsFile::NodeToken(std::string_view node) const {
  MutexLock lock(mutex_);
  auto it = node_tokens_.find(node);
  if (it == node_tokens_.end())
    return NotFoundError("no token for node '" + std::string(node) + "'");
  return it->second;
}

Status SecretsFile::SetNodeCertificateExpiry(std::string_view node, int64_t expires_unix) {
  MutexLock lock(mutex_);
  if (!node_tokens_.contains(node)) {
    return NotFoundError("no token for node '" + std::string(node) + "'");
  }
  node_certificate_expiry_[std::string(node)] = expires_unix;
  return WriteLocked();
}

StatusOr<int64_t> SecretsFile::NodeCertificateExpiry(std::string_view node) const {
  MutexLock lock(mutex_);
  auto it = node_certificate_expiry_.find(node);
  if (!node_tokens_.contains(node) || it == node_certificate_expiry_.end()) {
    return NotFoundError("no certificate expiry known for node '" + std::string(node) + "'");
  }
  return it->second;
}

StatusOr<std::string> SecretsFile::NodeCertificateName(std::string_view node) const {
  MutexLock lock(mutex_);
  if (!node_tokens_.contains(node)) {
    return NotFoundError("no token for node '" + std::string(node) + "'");
  }
  auto it = node_certificate_names_.find(node);
  if (it == node_certificate_names_.end()) return rpc::AgentCertificateName(std::string(node));
  return it->second;
}

Status SecretsFile::PutEnrollment(std::string_view node, std::string_view token,
                                  int64_t expires_unix, std::string_view certificate_name) {
  MutexLock lock(mutex_);
  enrollments_[std::string(node)] = {digest::Sha256Hex(token), expires_unix,
                                     std::string(certificate_name), "", ""};
  return WriteLocked();
}

StatusOr<std::string> SecretsFile::CheckEnrollment(std::string_view node, std::string_view token,
                                                   int64_t now_unix) const {
  MutexLock lock(mutex_);
  const std::string name(node);
  auto it = enrollments_.find(node);
  if (it == enrollments_.end()) {
    if (node_tokens_.contains(node)) {
      return Status(
          StatusCode::kPermissionDenied,
          "node '" + name +
              "' is already enrolled: its enrollment token works once (llmctl node down " + name +
              ", then node up, enrolls a new server)");
    }
    return FailedPreconditionError("node '" + name +
                                   "' has no enrollment pending (it was not registered for one, "
                                   "or it was removed)");
  }
  // Compared as digests of digests, in constant time (rpc::SameSecret).
  if (!rpc::SameSecret(digest::Sha256Hex(token), it->second.token_sha256)) {
    return Status(StatusCode::kPermissionDenied,
                  "the enrollment token presented for node '" + name + "' is not its own");
  }
  if (now_unix >= it->second.expires_unix) {
    return Status(StatusCode::kUnauthenticated,
                  "node '" + name + "''s enrollment token expired " +
                      std::to_string(now_unix - it->second.expires_unix) +
                      " s ago (it lasts an hour): llmctl node down " + name +
                      ", then node up, issues a new one");
  }
  return it->second.certificate_name;
}

bool SecretsFile::HasEnrollment(std::string_view node) const {
  MutexLock lock(mutex_);
  return enrollments_.contains(node);
}

Status SecretsFile::CompleteEnrollment(std::string_view node, std::string_view token) {
  MutexLock lock(mutex_);
  auto it = enrollments_.find(node);
  if (it == enrollments_.end()) {
    return FailedPreconditionError("node '" + std::string(node) + "' has no enrollment pending");
  }
  node_tokens_[std::string(node)] = std::string(token);
  node_certificate_names_[std::string(node)] = it->second.certificate_name;
  node_certificate_expiry_.erase(std::string(node));  // a new certificate's: set after this
  enrollments_.erase(it);
  return WriteLocked();
}

Status SecretsFile::RecordSentGrant(std::string_view node, std::string_view token,
                                    std::string_view certificate_pem) {
  MutexLock lock(mutex_);
  auto it = enrollments_.find(node);
  if (it == enrollments_.end()) {
    return FailedPreconditionError("node '" + std::string(node) + "' has no enrollment pending");
  }
  it->second.sent_token = std::string(token);
  it->second.sent_certificate_pem = std::string(certificate_pem);
  return WriteLocked();
}

StatusOr<SecretsFile::SentGrant> SecretsFile::SentGrantOf(std::string_view node) const {
  MutexLock lock(mutex_);
  auto it = enrollments_.find(node);
  if (it == enrollments_.end() || it->second.sent_token.empty()) {
    return NotFoundError("node '" + std::string(node) + "' has no enrollment grant sent");
  }
  return SentGrant{it->second.sent_token, it->second.sent_certificate_pem,
                   it->second.certificate_name};
}

Status SecretsFile::WriteLocked() {
  nlohmann::json tokens = nlohmann::json::object();
  for (const auto& [node, token] : node_tokens_) tokens[node] = token;
  nlohmann::json names = nlohmann::json::object();
  for (const auto& [node, name] : node_certificate_names_) names[node] = name;
  nlohmann::json expiry = nlohmann::json::object();
  for (const auto& [node, unix_time] : node_certificate_expiry_) expiry[node] = unix_time;
  nlohmann::json enrollments = nlohmann::json::object();
  for (const auto& [node, enrollment] : enrollments_) {
    enrollments[node] = {{"token_sha256", enrollment.token_sha256},
                         {"expires_unix", enrollment.expires_unix},
                         {"certificate_name", enrollment.certificate_name}};
    if (!enrollment.sent_token.empty()) {
      enrollments[node]["sent_token"] = enrollment.sent_token;
      enrollments[node]["sent_certificate_pem"] = enrollment.sent_certificate_pem;
    }
  }
  const std::string text = nlohmann::json{{"node_tokens", tokens},
                                          {"node_certificate_names", names},
                                          {"node_certificate_expiry", expiry},
                                          {"enrollments", enrollments}}
                               .dump(2) +
                           "\n";
  return WriteFileAtomically(path_, [&](int fd) -> Status {
    // Narrowed before the first byte is written, so the secret is never readable by others.
    if (fchmod(fd, 0600) != 0) return InternalError("cannot make " + path_ + " private");
    return WriteAll(fd, text.data(), text.size());
  });
}

}  // namespace llmctl::controller
