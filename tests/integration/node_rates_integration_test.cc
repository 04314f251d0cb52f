// A node's rates measured again end to end: `llmctl nodes --measure NODE --wait` (the CLI, in this
// process) asks the controller (in this process, its rounds run by hand on a manual clock), which
// asks a real llm-agent process over mutual TLS; the agent runs its llm-train's --probe (a shell
// script printing a fixed probe), the controller's health checks carry the new rates and whether a
// probe is underway, and the CLI prints them once they are stored.
#include <gtest/gtest.h>

#include <atomic>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <thread>

#include "common/estimate/rate_probe.h"
#include "controller/cli/commands.h"
#include "tests/integration/controller_agent_fixture.h"

namespace llmctl::controller {
namespace {

using namespace testing_support;  // NOLINT: the fixture's helpers
namespace fs = std::filesystem;
using std::chrono::milliseconds;
using std::chrono::seconds;

// A probe of the fake node taken at `measured_at`, with `memory` as its memory rate.
std::string ProbeJson(const std::string& measured_at, double memory) {
  estimate::RateProbe probe;
  probe.measured_at = measured_at;
  probe.device = "cpu";
  probe.device_name = "Test CPU";
  probe.threads = 2;
  probe.versions.libtorch = "2.15.0";
  probe.matmul = {{"fp32", 512, 5e10}};
  probe.memory_bytes_per_s = memory;
  return probe.ToJson().dump();
}

class NodeRatesIntegrationTest : public ControllerAgentTest {
 protected:
  // n1's row in ListNodes; an empty row when it is not listed.
  v1::NodeStatus Node() {
    grpc::ClientContext context;
    v1::ListNodesResponse nodes;
    EXPECT_TRUE(controller_->ListNodes(&context, {}, &nodes).ok());
    for (const v1::NodeStatus& node : nodes.nodes()) {
      if (node.name() == "n1") return node;
    }
    return {};
  }

  // The memory rate of n1's stored probe; 0 for none.
  double StoredMemoryRate() {
    const std::string json = Node().rate_probe_json();
    if (json.empty()) return 0;
    const StatusOr<estimate::RateProbe> probe =
        estimate::RateProbe::FromJson(nlohmann::json::parse(json));
    return probe.ok() ? probe->memory_bytes_per_s : 0;
  }
};

TEST_F(NodeRatesIntegrationTest, NodesMeasureWaitPrintsTheRatesTheAgentMeasuredAgain) {
  // The stand-in llm-train's --probe prints probe.json, taking a moment as a real probe does, so
  // that the probe is seen underway.
  const fs::path probe_file = dir_ / "probe.json";
  WriteFile(probe_file, ProbeJson("2026-11-29T01:00:00Z", 1e10),
            fs::perms::owner_read | fs::perms::owner_write);
  trainer_ = (dir_ / "probing-llm-train").string();
  WriteFile(trainer_,
            "#!/bin/sh\nif [ \"$1\" = --probe ]; then sleep 0.3; cat '" + probe_file.string() +
                "'; exit 0; fi\nexit 2\n",
            fs::perms::owner_all);
  AddAgent("n1", /*measure_rates=*/true);
  ASSERT_TRUE(RoundsUntil([&] {
    return StoredMemoryRate() == 1e10 && !Node().rate_probe_underway();
  })) << "the agent's first probe";

  WriteFile(probe_file, ProbeJson("2026-11-29T02:00:00Z", 2e10),
            fs::perms::owner_read | fs::perms::owner_write);
  std::ostringstream out;
  std::ostringstream err;
  std::atomic<bool> done = false;
  int exit_code = -1;
  std::thread cli([&] {
    const std::string socket = "unix:" + (dir_ / "controller.sock").string();
    cli::CliContext context{
        .env = [&](std::string_view name) -> std::optional<std::string> {
          if (name == "LLMCTL_CONTROLLER") return socket;
          if (name == "HOME") return dir_.string();
          return std::nullopt;
        },
        .out = out,
        .err = err,
        .out_is_tty = false,
        .self = dir_ / "llmctl",
        .daemon_ready_timeout = milliseconds(100),
        .watch_retry_interval = milliseconds(1),
        .rates_poll_interval = milliseconds(10),
        .rates_unchanged_timeout = seconds(30),
        .cloud_clock = nullptr,
        .agent_ready_timeout = seconds(1),
        .agent_poll_interval = seconds(1),
    };
    exit_code = cli::RunLlmctl({"llmctl", "nodes", "--measure", "n1", "--wait"}, context);
    done = true;
  });
  const bool ended = RoundsUntil([&] { return done.load(); });
  cli.join();
  ASSERT_TRUE(ended);
  EXPECT_EQ(exit_code, cli::kExitOk) << err.str();
  EXPECT_TRUE(out.str().starts_with("node n1 measures its rates again: measuring\n")) << out.str();
  EXPECT_NE(out.str().find("\nn1 rates: cpu Test CPU"), std::string::npos) << out.str();
  EXPECT_NE(out.str().find("memory 20 GB/s"), std::string::npos) << out.str();
  EXPECT_EQ(StoredMemoryRate(), 2e10);
  EXPECT_FALSE(Node().rate_probe_underway());
}

}  // namespace
}  // namespace llmctl::controller
