#include "rpc/version_check.h"

#include <optional>
#include <utility>

#include "common/text.h"

namespace llmctl::rpc {
namespace {

using grpc::experimental::InterceptionHookPoints;

// The value of `metadata`'s "llmctl-version", when it has one.
std::optional<std::string> VersionIn(
    const std::multimap<grpc::string_ref, grpc::string_ref>& metadata) {
  const auto found = metadata.find(kVersionHeader);
  if (found == metadata.end()) return std::nullopt;
  return std::string(found->second.data(), found->second.size());
}

// The other side's version as a message quotes it: its header is another process's text, up to
// gRPC's 8 KiB of metadata, and the message is printed on the user's terminal.
std::string Quoted(std::string_view version) { return OnOneLine(version, 64); }

// Why this CLI (of `version`) refuses a controller that announced `controller`, or none: an llmctld
// older than the announcement, whose API is older than this llmctl's. Its last words, with
// EmbeddedHint::kInclude, say how to stop an embedded llmctld.
std::string ControllerRefused(const std::optional<std::string>& controller,
                              const std::string& version, EmbeddedHint hint) {
  const bool with_hint = hint == EmbeddedHint::kInclude;
  if (!controller.has_value()) {
    std::string refusal =
        std::string("the controller does not say its version (it is older than this llmctl, ")
            .append(version)
            .append("); they must be the same version: run llmctl ")
            .append(version)
            .append("'s llmctld");
    if (with_hint) {
      refusal.append(kEmbeddedControllerHint)
          .append("llmctl daemon stop, and the next llmctl command starts this llmctl's)");
    }
    return refusal;
  }
  const std::string shown = Quoted(*controller);
  std::string refusal = std::string("the controller is llmctl ")
                            .append(shown)
                            .append(" and this llmctl ")
                            .append(version)
                            .append("; they must be the same version: install llmctl ")
                            .append(shown)
                            .append(" here, or run llmctl ")
                            .append(version)
                            .append("'s llmctld");
  if (with_hint) refusal.append(kEmbeddedControllerHint).append("llmctl daemon stop)");
  return refusal;
}

class VersionChecker : public grpc::experimental::Interceptor {
 public:
  VersionChecker(const std::string& version, EmbeddedHint hint) : version_(version), hint_(hint) {}

  void Intercept(grpc::experimental::InterceptorBatchMethods* methods) override {
    if (methods->QueryInterceptionHookPoint(InterceptionHookPoints::PRE_SEND_INITIAL_METADATA)) {
      methods->GetSendInitialMetadata()->emplace(kVersionHeader, version_);
    }
    if (methods->QueryInterceptionHookPoint(InterceptionHookPoints::POST_RECV_INITIAL_METADATA)) {
      controller_version_ = VersionIn(*methods->GetRecvInitialMetadata());
    }
    // Only an answer is checked: a refusal or a failure to connect says what it says.
    if (methods->QueryInterceptionHookPoint(InterceptionHookPoints::POST_RECV_STATUS) &&
        methods->GetRecvStatus()->ok() && controller_version_ != version_) {
      *methods->GetRecvStatus() =
          grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                       ControllerRefused(controller_version_, version_, hint_));
    }
    methods->Proceed();
  }

 private:
  const std::string version_;
  const EmbeddedHint hint_;
  std::optional<std::string> controller_version_;
};

class VersionCheckerFactory : public grpc::experimental::ClientInterceptorFactoryInterface {
 public:
  VersionCheckerFactory(std::string version, EmbeddedHint hint)
      : version_(std::move(version)), hint_(hint) {}
  grpc::experimental::Interceptor* CreateClientInterceptor(
      grpc::experimental::ClientRpcInfo*) override {
    return new VersionChecker(version_, hint_);
  }

 private:
  const std::string version_;
  const EmbeddedHint hint_;
};

}  // namespace

std::unique_ptr<grpc::experimental::ClientInterceptorFactoryInterface> VersionInterceptor(
    std::string version, EmbeddedHint hint) {
  return std::make_unique<VersionCheckerFactory>(std::move(version), hint);
}

void AnnounceVersion(grpc::ServerContext& context, std::string_view version) {
  context.AddInitialMetadata(kVersionHeader, std::string(version));
}

grpc::Status CheckClientVersion(const std::multimap<grpc::string_ref, grpc::string_ref>& metadata,
                                std::string_view version) {
  const std::optional<std::string> client = VersionIn(metadata);
  if (client == version) return grpc::Status::OK;
  const std::string install = std::string("; they must be the same version: install llmctl ")
                                  .append(version)
                                  .append(" here");
  if (!client.has_value()) {
    return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                        std::string("this llmctl does not say its version (it is older than the "
                                    "controller's, llmctl ")
                            .append(version)
                            .append(")")
                            .append(install));
  }
  return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                      std::string("this llmctl is ")
                          .append(Quoted(*client))
                          .append(" and the controller llmctl ")
                          .append(version)
                          .append(install));
}

}  // namespace llmctl::rpc
