#include "controller/dispatch/node_info_check.h"

#include <gtest/gtest.h>

#include <functional>
#include <string>

#include "common/version.h"

namespace llmctl::controller::dispatch {
namespace {

v1::NodeInfo GoodInfo() {
  v1::NodeInfo info;
  info.set_node("n1");
  v1::Device* cpu = info.add_devices();
  cpu->set_type("cpu");
  cpu->set_name("AMD EPYC");
  for (int i = 0; i < 2; ++i) {
    v1::Device* gpu = info.add_devices();
    gpu->set_type("cuda");
    gpu->set_index(i);
    gpu->set_name("NVIDIA H200");
    gpu->set_memory_bytes(int64_t{150} << 30);
  }
  info.set_host_memory_bytes(int64_t{1} << 40);
  info.set_cpu_count(64);
  info.set_nvidia_driver_version("580.95.05");
  info.set_driver_cuda_version("13.0");
  info.set_libtorch_version("2.15.0");
  info.set_libtorch_cuda_version("13.2");
  return info;
}

// An agent's description is another process's: a field no node has is refused by name, before the
// store keeps it, placement counts its devices or a notice repeats it for every waiting trial.
TEST(NodeInfoCheckTest, RefusesEachFieldNoNodeHasByName) {
  EXPECT_TRUE(CheckNodeInfo(GoodInfo()).ok());
  const std::pair<std::function<void(v1::NodeInfo&)>, std::string> cases[] = {
      {[](v1::NodeInfo& i) { i.mutable_devices(1)->set_type("tpu"); },
       "its devices[1].type is not cpu or cuda"},
      {[](v1::NodeInfo& i) { i.mutable_devices(2)->set_index(0); },
       "its devices[2].index repeats another cuda device's"},
      {[](v1::NodeInfo& i) { i.mutable_devices(1)->set_index(-1); },
       "its devices[1].index is negative"},
      {[](v1::NodeInfo& i) { i.mutable_devices(1)->set_memory_bytes(-1); },
       "its devices[1].memory_bytes is negative"},
      {[](v1::NodeInfo& i) { i.mutable_devices(0)->set_name("EPYC\x1b[2J"); },
       "its devices[0].name holds a control character"},
      {[](v1::NodeInfo& i) { i.set_nvidia_driver_version(std::string(8 << 20, '5')); },
       "its nvidia_driver_version longer than 64 bytes"},
      {[](v1::NodeInfo& i) { i.set_libtorch_version("2.15\n0"); },
       "its libtorch_version holds a control character"},
      // C1 (CSI) and a bidirectional override, which reorders the line it is printed on.
      {[](v1::NodeInfo& i) { i.mutable_devices(0)->set_name("EPYC\u009b2J"); },
       "its devices[0].name holds a control character"},
      {[](v1::NodeInfo& i) { i.set_libtorch_version("2.15\u202e0"); },
       "its libtorch_version holds a bidirectional text control"},
      {[](v1::NodeInfo& i) { i.set_cpu_count(-4); }, "its cpu_count is negative"},
      {[](v1::NodeInfo& i) { i.set_unusable(std::string(1025, 'x')); },
       "its unusable longer than 1024 bytes"},
      {[](v1::NodeInfo& i) { i.set_unusable("its llm-train\x1b]0;T\a is another version"); },
       "its unusable holds a control character"},
      {[](v1::NodeInfo& i) {
         for (int d = 0; d < kMaxNodeDevices; ++d) {
           v1::Device* device = i.add_devices();
           device->set_type("cuda");
           device->set_index(d + 2);
         }
       },
       "its devices number 1027, more than 1024"},
  };
  for (const auto& [edit, message] : cases) {
    v1::NodeInfo info = GoodInfo();
    edit(info);
    const Status checked = CheckNodeInfo(info);
    EXPECT_EQ(checked.code(), StatusCode::kInvalidArgument) << message;
    EXPECT_EQ(checked.message(), message);
  }
}

// The agent must be this controller's llmctl version; one that does not say its version (proto3's
// "" from an agent older than the field, or not llmctl's) is no exception.
TEST(NodeInfoCheckTest, AnAgentOfAnotherVersionIsRefusedNamingBothVersions) {
  EXPECT_TRUE(CheckAgentVersion("n1", std::string(kVersion)).ok());
  const Status older = CheckAgentVersion("n1", "0.0.1");
  EXPECT_EQ(older.code(), StatusCode::kFailedPrecondition);
  EXPECT_TRUE(older.message().starts_with(
      "node n1: its agent is llmctl 0.0.1, this controller llmctl " + std::string(kVersion) + ";"))
      << older.message();
  EXPECT_NE(older.message().find("llmctl node down n1"), std::string::npos) << older.message();
  const Status unsaid = CheckAgentVersion("n1", "");
  EXPECT_EQ(unsaid.code(), StatusCode::kFailedPrecondition);
  EXPECT_TRUE(unsaid.message().starts_with(
      "node n1: its agent is an llmctl that does not say its version, this controller llmctl "))
      << unsaid.message();
}

}  // namespace
}  // namespace llmctl::controller::dispatch
