#include "controller/secrets.h"

#include <openssl/rand.h>
#include <sys/stat.h>

#include <nlohmann/json.hpp>
#include <vector>

#include "common/atomic_file.h"
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
  struct stat info;
  if (stat(path.c_str(), &info) != 0) return secrets;  // created on the first change
  if ((info.st_mode & 077) != 0) {
    return FailedPreconditionError(path + " can be read by others; run chmod 600 on it");
  }
  ASSIGN_OR_RETURN(std::string text, ReadFileToString(path, 64 << 20));
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
  } catch (const nlohmann::json::exception& e) {
    return DataLossError(path + " is damaged: " + e.what());
  }
  return secrets;
}

Status SecretsFile::PutNodeToken(std::string_view node, std::string_view token,
                                 std::string_view certificate_name) {
  std::lock_guard lock(mutex_);
  node_tokens_[std::string(node)] = std::string(token);
  if (certificate_name.empty()) {
    node_certificate_names_.erase(std::string(node));
  } else {
    node_certificate_names_[std::string(node)] = std::string(certificate_name);
  }
  return WriteLocked();
}

Status SecretsFile::RemoveNodeToken(std::string_view node) {
  std::lock_guard lock(mutex_);
  const bool had_token = node_tokens_.erase(std::string(node)) > 0;
  const bool had_name = node_certificate_names_.erase(std::string(node)) > 0;
  if (!had_token && !had_name) return Status::Ok();
  return WriteLocked();
}

StatusOr<std::string> SecretsFile::NodeToken(std::string_view node) const {
  std::lock_guard lock(mutex_);
  auto it = node_tokens_.find(node);
  if (it == node_tokens_.end())
    return NotFoundError("no token for node '" + std::string(node) + "'");
  return it->second;
}

StatusOr<std::string> SecretsFile::NodeCertificateName(std::string_view node) const {
  std::lock_guard lock(mutex_);
  if (!node_tokens_.contains(node)) {
    return NotFoundError("no token for node '" + std::string(node) + "'");
  }
  auto it = node_certificate_names_.find(node);
  if (it == node_certificate_names_.end()) return rpc::AgentCertificateName(std::string(node));
  return it->second;
}

Status SecretsFile::WriteLocked() {
  nlohmann::json tokens = nlohmann::json::object();
  for (const auto& [node, token] : node_tokens_) tokens[node] = token;
  nlohmann::json names = nlohmann::json::object();
  for (const auto& [node, name] : node_certificate_names_) names[node] = name;
  const std::string text =
      nlohmann::json{{"node_tokens", tokens}, {"node_certificate_names", names}}.dump(2) + "\n";
  return WriteFileAtomically(path_, [&](int fd) -> Status {
    // Narrowed before the first byte is written, so the secret is never readable by others.
    if (fchmod(fd, 0600) != 0) return InternalError("cannot make " + path_ + " private");
    return WriteAll(fd, text.data(), text.size());
  });
}

}  // namespace llmctl::controller
