// Store's node registry: nodes' upserts and registration, their leases, their removal (which loses
// the attempts still running there) and references to secrets.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "controller/store/store.h"
#include "controller/store/store_test_support.h"

namespace llmctl::store {
namespace {

using ::testing::IsEmpty;

using namespace test_support;  // NOLINT(build/namespaces): the tests' shared vocabulary

TEST_F(StoreTest, NodesAndSecretReferences) {
  std::unique_ptr<Store> store = OpenStore();
  ASSERT_NE(store, nullptr);
  NodeRecord node{.name = "gpu-1",
                  .address = "10.0.0.5:7070",
                  .devices_json = R"([{"type":"cuda","count":1}])",
                  .last_seen = kNow,
                  .state = "connected",
                  .lease = std::nullopt};
  ASSERT_TRUE(store->UpsertNode(node).ok());
  node.state = "disconnected";
  node.last_seen = kNow + std::chrono::seconds(5);
  ASSERT_TRUE(store->UpsertNode(node).ok());
  ASSERT_TRUE(store
                  ->UpsertNode({.name = "cpu-0",
                                .address = "unix:/tmp/a.sock",
                                .devices_json = "[]",
                                .last_seen = kNow,
                                .state = "connected",
                                .lease = std::nullopt})
                  .ok());
  StatusOr<std::vector<NodeRecord>> nodes = store->ListNodes();
  ASSERT_TRUE(nodes.ok());
  ASSERT_EQ(nodes->size(), 2u);
  EXPECT_EQ((*nodes)[0].name, "cpu-0");
  EXPECT_EQ((*nodes)[1].state, "disconnected");
  EXPECT_EQ((*nodes)[1].last_seen, kNow + std::chrono::seconds(5));
  EXPECT_EQ(store
                ->UpsertNode({.name = "x",
                              .address = "a",
                              .devices_json = "{",
                              .last_seen = kNow,
                              .state = "connected",
                              .lease = std::nullopt})
                .code(),
            StatusCode::kInvalidArgument);

  // A node's lease survives the dispatcher's upserts of its state.
  const NodeLease lease{.name = "lab",
                        .site = "KVM@TACC",
                        .flavor = "g1.h100.pci.1",
                        .ends = kNow + std::chrono::hours(3)};
  ASSERT_TRUE(store->SetNodeLease("gpu-1", lease).ok());
  EXPECT_EQ(store->SetNodeLease("nobody", lease).code(), StatusCode::kNotFound);
  node.state = "connected";
  ASSERT_TRUE(store->UpsertNode(node).ok());
  nodes = store->ListNodes();
  ASSERT_TRUE(nodes.ok() && nodes->size() == 2u);
  EXPECT_EQ((*nodes)[1].lease, lease);
  EXPECT_EQ((*nodes)[1].state, "connected");
  EXPECT_FALSE((*nodes)[0].lease.has_value());

  // A health check's findings land only while the node is at the address it checked: one that
  // waited on the old address while UpdateNode moved the node does not move it back.
  NodeRecord checked = node;
  checked.address = "10.0.0.9:7070";  // the address before a move
  checked.state = "unreachable";
  ASSERT_TRUE(store->RecordNodeHealth(checked).ok());
  nodes = store->ListNodes();
  EXPECT_EQ((*nodes)[1].address, "10.0.0.5:7070");
  EXPECT_EQ((*nodes)[1].state, "connected");
  checked.address = node.address;
  checked.last_seen = kNow + std::chrono::seconds(9);
  ASSERT_TRUE(store->RecordNodeHealth(checked).ok());
  nodes = store->ListNodes();
  EXPECT_EQ((*nodes)[1].state, "unreachable");
  EXPECT_EQ((*nodes)[1].last_seen, kNow + std::chrono::seconds(9));
  EXPECT_EQ((*nodes)[1].lease, lease);
  checked.name = "nobody";  // never inserts
  ASSERT_TRUE(store->RecordNodeHealth(checked).ok());
  EXPECT_EQ(store->ListNodes()->size(), 2u);

  ASSERT_TRUE(store->PutSecretRef("openstack", "secrets.json#chameleon").ok());
  EXPECT_EQ(*store->GetSecretRef("openstack"), "secrets.json#chameleon");
  EXPECT_EQ(store->GetSecretRef("nope").status().code(), StatusCode::kNotFound);
}

TEST_F(StoreTest, RemovingANodeLosesItsRunningAttemptsAndRequeuesTheirTrialsAtOnce) {
  std::unique_ptr<Store> store = OpenStore();
  ASSERT_NE(store, nullptr);
  ASSERT_TRUE(store->RegisterNode(RegisteredNode("gpu-1")).ok());
  ASSERT_TRUE(store->RegisterNode(RegisteredNode("gpu-2")).ok());
  ASSERT_TRUE(store->PutSecretRef("gpu-1", "secrets.json#node_tokens/gpu-1").ok());
  ASSERT_TRUE(store->PutSecretRef("gpu-2", "secrets.json#node_tokens/gpu-2").ok());
  const std::vector<int64_t> trials = CreateTrials(*store, "e", {"a", "b", "c", "d"});
  ASSERT_EQ(*store->StartAttempt(trials[0], "gpu-1", kNow), 1);
  ASSERT_EQ(*store->StartAttempt(trials[1], "gpu-1", kNow), 1);
  ASSERT_EQ(*store->StartAttempt(trials[2], "gpu-2", kNow), 1);  // elsewhere: untouched
  ASSERT_EQ(*store->StartAttempt(trials[3], "gpu-1", kNow), 1);
  ASSERT_TRUE(store->FinishAttempt(trials[3], 1, TrialState::kOk, 0, "", kNow).ok());
  ASSERT_EQ(store->CancelTrial(trials[1])->size(), 1u);  // cancel requested while it runs

  const Time later = kNow + std::chrono::seconds(1);  // far less than any requeue_after
  StatusOr<NodeRemoval> removal = store->RemoveNode("gpu-1", later);
  ASSERT_TRUE(removal.ok()) << removal.status().ToString();
  EXPECT_EQ(removal->result, NodeRemoval::Result::kRemoved);
  EXPECT_EQ(removal->removed_at, later);
  ASSERT_EQ(removal->lost.size(), 2u);
  EXPECT_EQ(removal->lost[0].trial_id, trials[0]);
  EXPECT_EQ(removal->lost[1].trial_id, trials[1]);

  // The lost attempt's trial is queued again and its next attempt is 2; a cancelled one ends.
  EXPECT_EQ(store->GetTrial(trials[0])->state, TrialState::kQueued);
  EXPECT_EQ(store->GetTrial(trials[1])->state, TrialState::kCancelled);
  EXPECT_EQ(store->GetTrial(trials[2])->state, TrialState::kRunning);
  EXPECT_EQ(store->GetTrial(trials[3])->state, TrialState::kOk);
  EXPECT_EQ(QueryInt("SELECT COUNT(*) FROM attempts WHERE node = 'gpu-1' AND state = 'lost'"), 2);
  // Whatever the removed node's attempt still sends is fenced off.
  EXPECT_EQ(store->AppendEvents(trials[0], 1, std::vector<Event>{StepEvent(1, 0)}).status().code(),
            StatusCode::kFailedPrecondition);
  EXPECT_EQ(*store->StartAttempt(trials[0], "gpu-2", later), 2);

  // Gone from the list, its secret reference deleted, its lease refused; its history stays.
  StatusOr<std::vector<NodeRecord>> nodes = store->ListNodes();
  ASSERT_TRUE(nodes.ok());
  ASSERT_EQ(nodes->size(), 1u);
  EXPECT_EQ((*nodes)[0].name, "gpu-2");
  EXPECT_EQ(store->GetSecretRef("gpu-1").status().code(), StatusCode::kNotFound);
  EXPECT_TRUE(store->GetSecretRef("gpu-2").ok());
  EXPECT_EQ(
      store
          ->SetNodeLease("gpu-1", NodeLease{.name = "l", .site = "s", .flavor = "f", .ends = later})
          .code(),
      StatusCode::kNotFound);
  EXPECT_EQ(QueryInt("SELECT COUNT(*) FROM nodes WHERE name = 'gpu-1' AND removed_at IS NOT NULL"),
            1);
  // No new attempt starts there, and a health check racing with the removal does not revive it.
  const int64_t late = CreateTrials(*store, "late", {"x"})[0];
  EXPECT_EQ(store->StartAttempt(late, "gpu-1", later).status().code(),
            StatusCode::kFailedPrecondition);
  ASSERT_TRUE(store->UpsertNode(RegisteredNode("gpu-1")).ok());
  EXPECT_EQ(store->ListNodes()->size(), 1u);

  // Idempotent: a second removal changes nothing and says when the first one was.
  StatusOr<NodeRemoval> again = store->RemoveNode("gpu-1", later + std::chrono::seconds(9));
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  EXPECT_EQ(again->result, NodeRemoval::Result::kAlreadyRemoved);
  EXPECT_EQ(again->removed_at, later);
  EXPECT_THAT(again->lost, IsEmpty());
  StatusOr<NodeRemoval> unknown = store->RemoveNode("never-registered", later);
  ASSERT_TRUE(unknown.ok()) << unknown.status().ToString();
  EXPECT_EQ(unknown->result, NodeRemoval::Result::kUnknown);
  EXPECT_FALSE(unknown->removed_at.has_value());
}

TEST_F(StoreTest, ARemovedNodeRegisteredAgainComesBackWithoutItsOldLease) {
  std::unique_ptr<Store> store = OpenStore();
  ASSERT_NE(store, nullptr);
  ASSERT_TRUE(store->RegisterNode(RegisteredNode("gpu-1")).ok());
  ASSERT_TRUE(store
                  ->SetNodeLease("gpu-1", NodeLease{.name = "old",
                                                    .site = "KVM@TACC",
                                                    .flavor = "g1.h100.pci.1",
                                                    .ends = kNow + std::chrono::hours(1)})
                  .ok());
  // Registering a node that is there keeps its lease, as UpsertNode does.
  ASSERT_TRUE(store->RegisterNode(RegisteredNode("gpu-1")).ok());
  EXPECT_TRUE((*store->ListNodes())[0].lease.has_value());

  ASSERT_TRUE(store->RemoveNode("gpu-1", kNow).status().ok());
  NodeRecord fresh = RegisteredNode("gpu-1");
  fresh.address = "";
  fresh.state = "registered";
  ASSERT_TRUE(store->RegisterNode(fresh).ok());
  StatusOr<std::vector<NodeRecord>> nodes = store->ListNodes();
  ASSERT_TRUE(nodes.ok());
  ASSERT_EQ(nodes->size(), 1u);
  EXPECT_EQ((*nodes)[0].state, "registered");
  EXPECT_FALSE((*nodes)[0].lease.has_value());
  const int64_t trial = CreateTrials(*store, "e", {"a"})[0];
  EXPECT_EQ(*store->StartAttempt(trial, "gpu-1", kNow), 1);
  EXPECT_EQ(store->RemoveNode("gpu-1", kNow)->result, NodeRemoval::Result::kRemoved);
}

}  // namespace
}  // namespace llmctl::store
