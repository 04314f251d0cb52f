// The CLI and a controller it reaches on TCP must be the same llmctl release, like the controller
// and its agents (docs/architecture.md, "Versions"): a request's fields mean what the controller's
// version makes of them, and a field it does not know is dropped without a word. So each side says
// its version in the "llmctl-version" metadata, the CLI on every call of its channel
// (VersionInterceptor) and the controller in every answer (AnnounceVersion), and each refuses the
// other's when it differs or is not said (a peer older than the header), with FAILED_PRECONDITION
// naming both versions.
#ifndef LLMCTL_RPC_VERSION_CHECK_H_
#define LLMCTL_RPC_VERSION_CHECK_H_

#include <grpcpp/grpcpp.h>

#include <map>
#include <memory>
#include <string>
#include <string_view>

namespace llmctl::rpc {

inline constexpr char kVersionHeader[] = "llmctl-version";

// How VersionInterceptor's refusal begins its last words, the step for an embedded llmctld: " (the
// embedded one: llmctl daemon stop...)", when EmbeddedHint::kInclude.
inline constexpr std::string_view kEmbeddedControllerHint = " (the embedded one: ";

// Whether VersionInterceptor's refusal of a controller's version ends with the step for an embedded
// llmctld (kEmbeddedControllerHint): kLeaveOut where the caller takes that step itself (llmctl
// stops an llmctld it started, controller/cli/daemons.h), so that the refusal it passes on is
// whole without the user's step, where it cut that step out of the refusal's text.
enum class EmbeddedHint { kInclude, kLeaveOut };

// Client side: sends "llmctl-version: <version>" on every call of the channel, and ends a call that
// the server answered OK announcing another version with FAILED_PRECONDITION naming both instead
// (such a server has run the call by then: the refusal is the server's to give,
// CheckClientVersion). An answer that announces none is refused the same way, saying the
// controller's version is not known: every llmctld since the header announces its own, so one that
// does not is older and speaks an older API, as CheckClientVersion holds of a client that sends
// none.
std::unique_ptr<grpc::experimental::ClientInterceptorFactoryInterface> VersionInterceptor(
    std::string version, EmbeddedHint hint = EmbeddedHint::kInclude);

// Server side, first thing in a handler: puts "llmctl-version: <version>" in the answer's initial
// metadata, which VersionInterceptor reads.
void AnnounceVersion(grpc::ServerContext& context, std::string_view version);

// Server side: OK when the call's "llmctl-version" is `version`; else FAILED_PRECONDITION naming
// both versions (or saying the client names none: an llmctl older than the header) and that the
// CLI's llmctl must be `version`.
grpc::Status CheckClientVersion(const std::multimap<grpc::string_ref, grpc::string_ref>& metadata,
                                std::string_view version);

}  // namespace llmctl::rpc

#endif  // LLMCTL_RPC_VERSION_CHECK_H_
