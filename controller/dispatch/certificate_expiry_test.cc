// The dispatcher's health check and node certificates (controller/node_certificates.h): a node
// whose certificate expired while the controller was off is reported `expired` and not dialled.
#include <gtest/gtest.h>

#include "controller/dispatch/dispatch_test_support.h"
#include "controller/node_certificates.h"

namespace llmctl::controller::dispatch_test {
namespace {

using CertificateExpiryTest = DispatcherTest;

TEST_F(CertificateExpiryTest, ANodeWhoseCertificateExpiredUnrenewedIsReportedAndNotDialled) {
  Tick();
  auto nodes = daemon_->store().ListNodes();
  ASSERT_TRUE(nodes.ok() && nodes->size() == 1);
  EXPECT_EQ(nodes->front().state, "connected");
  // `llmctl nodes` shows the certificate's expiry, as RegisterNode issued it.
  const auto expiry = rpc::CertificateExpiry(credentials_.certificate_pem());
  ASSERT_TRUE(expiry.ok());
  {
    grpc::ClientContext context;
    v1::ListNodesResponse listed;
    ASSERT_TRUE(controller_->ListNodes(&context, {}, &listed).ok());
    ASSERT_EQ(listed.nodes_size(), 1);
    EXPECT_EQ(listed.nodes(0).certificate_expires_unix(),
              std::chrono::system_clock::to_time_t(*expiry));
  }

  // The controller was off until an hour past the expiry: no renewal came in time.
  clock_.Advance(std::chrono::duration_cast<milliseconds>(*expiry - clock_.Now()) +
                 std::chrono::hours(1));
  int calls_before;
  {
    std::lock_guard lock(agent_state_.mutex);
    calls_before = agent_state_.node_info_calls;
  }
  const int64_t experiment = SubmitOne();
  Tick();
  nodes = daemon_->store().ListNodes();
  ASSERT_TRUE(nodes.ok() && nodes->size() == 1);
  EXPECT_EQ(nodes->front().state, "expired");
  EXPECT_EQ(OnlyTrial(experiment).state, store::TrialState::kQueued);
  std::lock_guard lock(agent_state_.mutex);
  EXPECT_EQ(agent_state_.node_info_calls, calls_before);
  EXPECT_TRUE(agent_state_.runs.empty());
}

}  // namespace
}  // namespace llmctl::controller::dispatch_test
