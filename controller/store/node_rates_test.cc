// Store's node rates: one probe per node, a changed probe replacing the old, the same one again
// changing nothing, removed nodes' rates not listed, and what is not a JSON object refused.
#include <gtest/gtest.h>

#include <chrono>
#include <memory>
#include <string>

#include "controller/store/store.h"
#include "controller/store/store_test_support.h"

namespace llmctl::store {
namespace {

using namespace test_support;  // NOLINT(build/namespaces): the tests' shared vocabulary

constexpr char kProbe[] = R"({"version":1,"identity":{"device":"cpu"},"memory_bytes_per_s":1e10})";
constexpr char kNewerProbe[] =
    R"({"version":1,"identity":{"device":"cpu"},"memory_bytes_per_s":2e10})";

NodeRecord Node(std::string name) {
  return {.name = std::move(name),
          .address = "unix:/tmp/agent.sock",
          .devices_json = "[]",
          .last_seen = kNow,
          .state = "connected",
          .lease = std::nullopt};
}

TEST_F(StoreTest, NodeRatesAreOnePerNodeAndAChangedProbeReplacesTheOld) {
  std::unique_ptr<Store> store = OpenStore();
  ASSERT_NE(store, nullptr);
  ASSERT_TRUE(store->UpsertNode(Node("local")).ok());
  ASSERT_TRUE(store->UpsertNode(Node("gpu-1")).ok());

  EXPECT_EQ(store->PutNodeRates("local", kProbe, kNow).value(), true);
  EXPECT_EQ(store->PutNodeRates("local", kProbe, kNow + std::chrono::seconds(5)).value(), false);
  EXPECT_EQ(QueryInt("SELECT stored_at FROM node_rates WHERE node = 'local'"),
            std::chrono::duration_cast<std::chrono::milliseconds>(kNow.time_since_epoch()).count());
  EXPECT_EQ(store->PutNodeRates("local", kNewerProbe, kNow + std::chrono::seconds(9)).value(),
            true);
  StatusOr<std::map<std::string, std::string>> rates = store->NodeRates();
  ASSERT_TRUE(rates.ok()) << rates.status().ToString();
  EXPECT_EQ(*rates, (std::map<std::string, std::string>{{"local", kNewerProbe}}));
  EXPECT_EQ(QueryInt("SELECT COUNT(*) FROM node_rates"), 1);

  // A removed node's rates are not listed; registered again, it measures anew.
  ASSERT_TRUE(store->PutNodeRates("gpu-1", kProbe, kNow).value());
  ASSERT_TRUE(store->RemoveNode("gpu-1", kNow).ok());
  EXPECT_EQ(store->NodeRates()->count("gpu-1"), 0u);

  EXPECT_EQ(store->PutNodeRates("local", "[1]", kNow).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(store->PutNodeRates("local", "{", kNow).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(store->PutNodeRates("", kProbe, kNow).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(store->NodeRates()->at("local"), kNewerProbe);
}

}  // namespace
}  // namespace llmctl::store
