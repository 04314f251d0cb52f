// Incremental sha256 as lowercase hex (OpenSSL's EVP), for blobs, tree manifests and artifacts.
#ifndef LLMCTL_AGENT_SHA256_H_
#define LLMCTL_AGENT_SHA256_H_

#include <memory>
#include <string>
#include <string_view>

namespace llmctl::agent {

class Sha256 {
 public:
  Sha256();
  ~Sha256();
  Sha256(const Sha256&) = delete;
  Sha256& operator=(const Sha256&) = delete;

  void Update(std::string_view data);
  // The digest of everything updated so far; the hasher is spent afterwards.
  std::string HexDigest();

 private:
  struct Context;
  std::unique_ptr<Context> context_;
};

std::string Sha256Hex(std::string_view data);

}  // namespace llmctl::agent

#endif  // LLMCTL_AGENT_SHA256_H_
