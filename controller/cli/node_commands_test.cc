// llmctl's commands that concern nodes, against an in-process fake Controller: an experiment's
// target and the nodes that match it, `llmctl nodes`, and the estimate's rates and runs from a
// configured controller.
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>

#include "common/estimate/rate_probe.h"
#include "common/estimate/step_time.h"
#include "controller/cli/commands.h"
#include "controller/cli/commands_test_support.h"
#include "controller/cli/llmctl.h"
#include "controller/cli/rates_text.h"
#include "tests/support/scoped_time_zone.h"

namespace llmctl::cli {
namespace {

namespace fs = std::filesystem;

TEST(ProvisionLeaseNameTest, IsADnsLabelFromTheExperimentAndFlavor) {
  EXPECT_EQ(ProvisionLeaseName("Single GPU", "g1.h100.pci.1"), "llmctl-single-gpu-g1-h100-pci-1");
  const std::string long_name = ProvisionLeaseName(std::string(80, 'x'), "g1.h100.pci.1");
  EXPECT_EQ(long_name.size(), 63u);
  EXPECT_EQ(ProvisionLeaseName(std::string(55, 'x') + "._", "f"),
            "llmctl-" + std::string(55, 'x'));  // no trailing '-'
}

// The experiment file's target is printed on one line: its flavor (in the refusal's commands
// too) holds no escape sequence or line break there.
TEST_F(CommandsTest, ATargetsFlavorIsPrintedOnOneLine) {
  Write("gpu.yaml",
        "name: single\n"
        "target: {site: KVM@TACC, flavor: \"g1\\e[31m\\nh100\"}\n"
        "model: llmctl-demo\n"
        "init: random\n"
        "tokenizer: node:/data/tokenizer.json\n"
        "data: {path: node:/data/synthetic.jsonl}\n");
  EXPECT_EQ(Run({"submit", (dir_ / "gpu.yaml").string()}), kExitFailed);
  EXPECT_EQ(err_.str().find('\x1b'), std::string::npos) << err_.str();
  EXPECT_NE(err_.str().find("no node of the controller's is on a lease of g1 [31m h100 at "
                            "KVM@TACC. `llmctl submit --provision`"),
            std::string::npos)
      << err_.str();
}

TEST_F(CommandsTest, ATargetWithNoMatchingNodeSaysWhatToRunAndSubmitsNothing) {
  Write("gpu.yaml",
        "name: single\n"
        "target: {site: KVM@TACC, flavor: g1.h100.pci.1}\n"
        "model: llmctl-demo\n"
        "init: random\n"
        "tokenizer: node:/data/tokenizer.json\n"
        "data: {path: node:/data/synthetic.jsonl}\n");
  {
    std::lock_guard lock(fake_.mutex_);
    v1::NodeStatus* other = fake_.nodes_.add_nodes();  // a lease of another flavor
    other->set_name("a100");
    other->mutable_lease()->set_flavor("g1.a100.pci.1");
    other->mutable_lease()->set_site("KVM@TACC");
    other->mutable_lease()->set_ends_unix(4'000'000'000);
  }
  EXPECT_EQ(Run({"submit", (dir_ / "gpu.yaml").string()}), kExitFailed);
  EXPECT_NE(err_.str().find("no node of the controller's is on a lease of g1.h100.pci.1 at "
                            "KVM@TACC. `llmctl submit --provision`"),
            std::string::npos)
      << err_.str();
  EXPECT_NE(
      err_.str().find(
          "llmctl lease create --flavor g1.h100.pci.1 --name "
          "llmctl-single-g1-h100-pci-1 --duration 2h50m --wait --site KVM@TACC && llmctl node "
          "--site KVM@TACC up --lease llmctl-single-g1-h100-pci-1"),
      std::string::npos)
      << err_.str();
  {
    std::lock_guard lock(fake_.mutex_);
    EXPECT_FALSE(fake_.submitted_.has_value());
    v1::NodeStatus* node = fake_.nodes_.add_nodes();
    node->set_name("llmctl-single-g1-h100-pci-1");
    node->mutable_lease()->set_flavor("g1.h100.pci.1");
    node->mutable_lease()->set_site("KVM@TACC");
    node->mutable_lease()->set_ends_unix(4'000'000'000);
  }
  ASSERT_EQ(Run({"submit", (dir_ / "gpu.yaml").string()}), kExitOk) << err_.str();
  EXPECT_NE(err_.str().find("node llmctl-single-g1-h100-pci-1"), std::string::npos);
  std::lock_guard lock(fake_.mutex_);
  EXPECT_TRUE(fake_.submitted_.has_value());
}

// The commands to run are for a shell: a flavor's name is the cloud's free text, and one holding a
// space and a quote stays one word there, quoted. Spliced in as it was, the shell split it at the
// space and read its quote as the start of a string running to the line's end.
TEST_F(CommandsTest, TheCommandsToRunQuoteTheWordsAShellWouldSplit) {
  Write("gpu.yaml",
        "name: single\n"
        "target: {site: KVM@TACC, flavor: \"bob's gpu\"}\n"
        "model: llmctl-demo\n"
        "init: random\n"
        "tokenizer: node:/data/tokenizer.json\n"
        "data: {path: node:/data/synthetic.jsonl}\n");
  EXPECT_EQ(Run({"submit", (dir_ / "gpu.yaml").string()}), kExitFailed);
  EXPECT_NE(err_.str().find("or run: llmctl lease create --flavor 'bob'\\''s gpu' --name "
                            "llmctl-single-bob-s-gpu --duration 2h50m --wait --site KVM@TACC && "
                            "llmctl node --site KVM@TACC up --lease llmctl-single-bob-s-gpu"),
            std::string::npos)
      << err_.str();
}

// A bare-metal target names a node type (experiments/single-a100.yaml): a node whose lease
// reserved that type serves it, and without one the lease to make reserves hosts by node type.
TEST_F(CommandsTest, ABareMetalTargetNamesANodeType) {
  Write("a100.yaml",
        "name: single-a100\n"
        "target: {site: CHI@UC, node_type: compute_gigaio}\n"
        "model: llmctl-demo\n"
        "init: random\n"
        "tokenizer: node:/data/tokenizer.json\n"
        "data: {path: node:/data/synthetic.jsonl}\n");
  EXPECT_EQ(Run({"submit", (dir_ / "a100.yaml").string()}), kExitFailed);
  EXPECT_NE(err_.str().find(
                "llmctl lease create --node-type compute_gigaio --name "
                "llmctl-single-a100-compute-gigaio --duration 2h50m --wait --site CHI@UC && llmctl "
                "node --site CHI@UC up --lease llmctl-single-a100-compute-gigaio"),
            std::string::npos)
      << err_.str();
  {
    std::lock_guard lock(fake_.mutex_);
    v1::NodeStatus* node = fake_.nodes_.add_nodes();
    node->set_name("a100-node");
    node->mutable_lease()->set_flavor("compute_gigaio");
    node->mutable_lease()->set_site("CHI@UC");
    node->mutable_lease()->set_ends_unix(4'000'000'000);
  }
  ASSERT_EQ(Run({"submit", (dir_ / "a100.yaml").string()}), kExitOk) << err_.str();
  EXPECT_NE(err_.str().find("target compute_gigaio: node a100-node"), std::string::npos);

  Write("both.yaml",
        "name: both\n"
        "target: {site: CHI@UC, node_type: compute_gigaio, flavor: g1.h100.pci.1}\n"
        "model: llmctl-demo\n"
        "init: random\n"
        "tokenizer: node:/data/tokenizer.json\n"
        "data: {path: node:/data/synthetic.jsonl}\n");
  EXPECT_NE(Run({"submit", (dir_ / "both.yaml").string()}), kExitOk);
  EXPECT_NE(err_.str().find("a flavor (KVM sites) or a node_type (bare-metal sites)"),
            std::string::npos)
      << err_.str();
}

TEST_F(CommandsTest, NodesShowsWhyANodeIsUnusable) {
  const std::string reason =
      "node n1: NVIDIA driver 560.35.03 supports CUDA up to 12.6, but llm-train's LibTorch 2.15.0 "
      "was built for CUDA 13.2: use an image whose NVIDIA driver supports CUDA 13 (driver >= "
      "580.65.06), or an llm-train built with a LibTorch for CUDA 12.x";
  {
    std::lock_guard lock(fake_.mutex_);
    v1::NodeStatus* node = fake_.nodes_.add_nodes();
    node->set_name("n1");
    node->set_state("unusable");
    node->set_unusable(reason);
    v1::NodeStatus* fine = fake_.nodes_.add_nodes();
    fine->set_name("n2");
    fine->set_state("connected");
  }
  ASSERT_EQ(Run({"nodes"}), kExitOk) << err_.str();
  EXPECT_NE(out_.str().find("n1    unusable"), std::string::npos) << out_.str();
  EXPECT_TRUE(out_.str().ends_with("\n! " + reason + "\n")) << out_.str();
}

// Right after the daemons start the agent has not answered yet: not reached, where the table
// said "unreachable" and "last seen never"; one that answered before and stopped is unreachable.
TEST_F(CommandsTest, NodesSaysANodeNeverReachedIsNotReachedYet) {
  {
    std::lock_guard lock(fake_.mutex_);
    v1::NodeStatus* starting = fake_.nodes_.add_nodes();
    starting->set_name("local");
    starting->set_state("unreachable");
    v1::NodeStatus* lost = fake_.nodes_.add_nodes();
    lost->set_name("gone1");
    lost->set_state("unreachable");
    lost->set_last_seen_unix(1'700'000'000);
  }
  ASSERT_EQ(Run({"nodes"}), kExitOk) << err_.str();
  EXPECT_NE(out_.str().find("local  not reached yet"), std::string::npos) << out_.str();
  EXPECT_NE(out_.str().find("gone1  unreachable"), std::string::npos) << out_.str();
}

using llmctl::testing::ScopedTimeZone;

// 1'700'000'000 is 2023-11-14 22:13:20 UTC, 1'690'000'000 2023-07-22 04:26:40 UTC. The zones need
// no tz database.
TEST(FormatUnixTimeTest, PrintsLocalTimeWithItsZonesAbbreviation) {
  {
    ScopedTimeZone zone("UTC0");
    EXPECT_EQ(FormatUnixTime(1'700'000'000), "2023-11-14 22:13 UTC");
  }
  {
    ScopedTimeZone zone("IST-5:30");
    EXPECT_EQ(FormatUnixTime(1'700'000'000), "2023-11-15 03:43 IST");
  }
  {
    ScopedTimeZone zone("CET-1CEST,M3.5.0,M10.5.0/3");  // the abbreviation in force at that time
    EXPECT_EQ(FormatUnixTime(1'700'000'000), "2023-11-14 23:13 CET");
    EXPECT_EQ(FormatUnixTime(1'690'000'000), "2023-07-22 06:26 CEST");
  }
}

// A CPU probe of `threads` threads by `name`, taken 2026-11-29T01:00:00Z with LibTorch 2.15.0; its
// rates are the caller's.
estimate::RateProbe CpuProbe(const std::string& name, int threads) {
  estimate::RateProbe probe;
  probe.measured_at = "2026-11-29T01:00:00Z";
  probe.device = "cpu";
  probe.device_name = name;
  probe.threads = threads;
  probe.versions.libtorch = "2.15.0";
  return probe;
}

// `llmctl nodes --measure NODE` asks the controller, which asks the node's agent, and says what
// comes next; the controller's refusal is the user's to read, with its exit code. `nodes` then
// shows what the agent says of its rates while it measures them, beside those that serve
// meanwhile.
TEST_F(CommandsTest, NodesMeasureAsksTheControllerAndNodesShowsTheProbeUnderWay) {
  ASSERT_EQ(Run({"nodes", "--measure", "gpu-1"}), kExitOk) << err_.str();
  EXPECT_EQ(out_.str(),
            "node gpu-1 measures its rates again (measuring); `llmctl nodes` shows them once they "
            "are measured, and the rates before serve until then\n");
  // With a configured controller, `local` is a node like any other: this machine runs none of
  // its trials.
  ASSERT_EQ(Run({"nodes", "--measure", "local"}), kExitOk) << err_.str();
  {
    std::lock_guard lock(fake_.mutex_);
    EXPECT_EQ(fake_.measured_, (std::vector<std::string>{"gpu-1", "local"}));
    fake_.measure_result_ =
        grpc::Status(grpc::StatusCode::NOT_FOUND, "no node named n9 is registered (llmctl nodes)");
  }
  EXPECT_EQ(Run({"nodes", "--measure", "n9"}), kExitInvalidInput);
  EXPECT_EQ(err_.str(), "llmctl: no node named n9 is registered (llmctl nodes)\n");
  {
    std::lock_guard lock(fake_.mutex_);
    fake_.measure_result_ = grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                                         "node n1 is not connected: its agent has not answered "
                                         "the controller");
  }
  EXPECT_EQ(Run({"nodes", "--measure", "n1"}), kExitFailed);
  EXPECT_EQ(err_.str(),
            "llmctl: node n1 is not connected: its agent has not answered the controller\n");

  estimate::RateProbe probe = CpuProbe("Test CPU", 2);
  probe.matmul = {{"fp32", 512, 5e10}};
  probe.memory_bytes_per_s = 1e10;
  {
    std::lock_guard lock(fake_.mutex_);
    v1::NodeStatus* again = fake_.nodes_.add_nodes();
    again->set_name("n1");
    again->set_state("connected");
    again->set_rate_probe_json(probe.ToJson().dump());
    again->set_rate_probe_pending("measuring");
    v1::NodeStatus* first = fake_.nodes_.add_nodes();
    first->set_name("n2");
    first->set_state("connected");
    first->set_rate_probe_pending("waiting for the running trial to end\x1b[2J");
  }
  ASSERT_EQ(Run({"nodes"}), kExitOk) << err_.str();
  EXPECT_NE(out_.str().find("\nn1 rates: cpu Test CPU"), std::string::npos) << out_.str();
  EXPECT_NE(out_.str().find("\nn1 rates: measuring (those above serve meanwhile)\n"),
            std::string::npos)
      << out_.str();
  EXPECT_NE(out_.str().find("\nn2 rates: waiting for the running trial to end [2J\n"),
            std::string::npos)
      << out_.str();
}

// A node as ListNodes shows it: connected unless `state` says otherwise, with `probe_json` as its
// rates and the agent's note on them.
v1::ListNodesResponse NodeList(const std::string& probe_json, const std::string& pending,
                               bool underway, const std::string& state = "connected") {
  v1::ListNodesResponse list;
  v1::NodeStatus* node = list.add_nodes();
  node->set_name("n1");
  node->set_state(state);
  node->set_rate_probe_json(probe_json);
  node->set_rate_probe_pending(pending);
  node->set_rate_probe_underway(underway);
  return list;
}

// `nodes --measure NODE --wait` follows the node's probe through the controller: it prints each
// new note of the agent's while the probe is underway, then the new rates (exit 0), or why the
// node has none (exit 1, the rates from before serving on).
TEST_F(CommandsTest, NodesMeasureWaitFollowsTheProbeToItsRates) {
  estimate::RateProbe old_probe = CpuProbe("Test CPU", 2);
  old_probe.matmul = {{"fp32", 512, 5e10}};
  old_probe.memory_bytes_per_s = 1e10;
  estimate::RateProbe new_probe = old_probe;
  new_probe.measured_at = "2026-11-29T02:00:00Z";
  new_probe.matmul = {{"fp32", 512, 6e10}};
  const std::string old_json = old_probe.ToJson().dump();
  const std::string new_json = new_probe.ToJson().dump();
  {
    std::lock_guard lock(fake_.mutex_);
    fake_.later_nodes_ = {NodeList(old_json, "", false),
                          NodeList(old_json, "measuring", true),
                          NodeList(old_json, "waiting for the running trial to end", true),
                          NodeList(old_json, "waiting for the running trial to end", true),
                          NodeList(old_json, "measuring", true),
                          NodeList(new_json, "", false)};
  }
  ASSERT_EQ(Run({"nodes", "--measure", "n1", "--wait"}), kExitOk) << err_.str();
  EXPECT_EQ(out_.str(),
            "node n1 measures its rates again: measuring\n"
            "node n1: waiting for the running trial to end\n"
            "node n1: measuring\n" +
                NodeRatesText("n1 rates:", new_json));
  EXPECT_NE(out_.str().find("60 GFLOP/s"), std::string::npos) << out_.str();

  // The controller's notes are another process's words: each on one line, without its escapes,
  // cut to the quoted line's bytes.
  {
    std::lock_guard lock(fake_.mutex_);
    fake_.later_nodes_ = {NodeList(old_json, "", false),
                          NodeList(old_json, "\x1b[2J" + std::string(5000, 'x'), true),
                          NodeList(new_json, "", false)};
  }
  ASSERT_EQ(Run({"nodes", "--measure", "n1", "--wait"}), kExitOk) << err_.str();
  EXPECT_EQ(out_.str().find('\x1b'), std::string::npos);
  for (size_t start = 0, end; start < out_.str().size(); start = end + 1) {
    end = out_.str().find('\n', start);
    if (out_.str().compare(start, 9, "n1 rates:") == 0) continue;  // the rates' own description
    EXPECT_LT(end - start, 500u) << out_.str().substr(start, 80);
  }

  // The probe failed: the agent says why, on one line, and the rates from before serve on.
  {
    std::lock_guard lock(fake_.mutex_);
    fake_.later_nodes_ = {
        NodeList(old_json, "", false), NodeList(old_json, "measuring", true),
        NodeList(old_json,
                 "not measured again: busy\x1b[2J; that was attempt 3 of 3; the rates measured "
                 "before serve on",
                 false)};
  }
  EXPECT_EQ(Run({"nodes", "--measure", "n1", "--wait"}), kExitFailed);
  EXPECT_EQ(err_.str(),
            "llmctl: node n1: not measured again: busy [2J; that was attempt 3 of 3; the rates "
            "measured before serve on\n");

  // The controller read the agent before the ask: no probe underway and nothing new, until the
  // next health check shows the probe; then its rates.
  {
    std::lock_guard lock(fake_.mutex_);
    fake_.later_nodes_ = {NodeList(old_json, "", false), NodeList(old_json, "", false),
                          NodeList(old_json, "", false), NodeList(old_json, "measuring", true),
                          NodeList(new_json, "", false)};
  }
  EXPECT_EQ(Run({"nodes", "--measure", "n1", "--wait"}), kExitOk) << err_.str();
  EXPECT_TRUE(out_.str().ends_with(NodeRatesText("n1 rates:", new_json))) << out_.str();
  // ... but an agent that forgot the ask (it restarted) shows nothing new for good.
  {
    std::lock_guard lock(fake_.mutex_);
    fake_.later_nodes_ = {NodeList(old_json, "", false)};
  }
  EXPECT_EQ(Run({"nodes", "--measure", "n1", "--wait"}), kExitFailed);
  EXPECT_EQ(err_.str(),
            "llmctl: node n1 shows no probe underway and the rates from before: its agent may "
            "have restarted since the ask; `llmctl nodes --measure n1` asks again\n");

  // A node out of reach says nothing of its probe.
  {
    std::lock_guard lock(fake_.mutex_);
    fake_.later_nodes_ = {NodeList(old_json, "", false), NodeList(old_json, "measuring", true),
                          NodeList(old_json, "", false, "unreachable")};
  }
  EXPECT_EQ(Run({"nodes", "--measure", "n1", "--wait"}), kExitFailed);
  EXPECT_EQ(err_.str(),
            "llmctl: node n1 is unreachable now: whether it measured its rates again is not "
            "known; `llmctl nodes` shows them once it is connected again\n");

  // --wait waits for --measure's rates only.
  EXPECT_EQ(Run({"nodes", "--wait"}), kExitInvalidInput);
  EXPECT_NE(err_.str().find("--measure"), std::string::npos) << err_.str();
}

// Ctrl-C while `nodes --measure NODE --wait` waits ends only the waiting: it says that the node
// measures on and exits 130, as `submit --wait` says its experiment runs on.
TEST_F(CommandsTest, NodesMeasureWaitInterruptedSaysTheNodeMeasuresOn) {
  // The child runs this test afresh, its fake controller's threads included.
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  const auto wait_then_interrupt = [this] {
    {
      std::lock_guard lock(fake_.mutex_);
      fake_.later_nodes_ = {NodeList("", "", false), NodeList("", "measuring", true)};
    }
    std::thread([this] {
      // Once the waiting has asked how the probe goes a few times.
      for (;;) {
        {
          std::lock_guard lock(fake_.mutex_);
          if (fake_.list_nodes_calls_ >= 3) break;
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
      }
      ::kill(::getpid(), SIGINT);
    }).detach();
    Run({"nodes", "--measure", "n1", "--wait"});
  };
  EXPECT_EXIT(
      wait_then_interrupt(), ::testing::ExitedWithCode(130),
      "llmctl: interrupted; node n1 measures its rates on: `llmctl nodes` shows them once they are "
      "measured");
}

// `llmctl nodes` shows when each node was last seen, its lease's end and its certificate's expiry
// in the terminal's zone, each saying which zone that is.
TEST_F(CommandsTest, NodesPrintsItsTimesWithTheirZone) {
  {
    std::lock_guard lock(fake_.mutex_);
    v1::NodeStatus* node = fake_.nodes_.add_nodes();
    node->set_name("n1");
    node->set_state("connected");
    node->set_last_seen_unix(1'700'000'000);
    node->mutable_lease()->set_ends_unix(1'700'003'600);
    node->set_certificate_expires_unix(1'700'086'400);
  }
  ScopedTimeZone zone("IST-5:30");
  ASSERT_EQ(Run({"nodes"}), kExitOk) << err_.str();
  EXPECT_NE(out_.str().find("2023-11-15 03:43 IST  2023-11-15 04:43 IST  2023-11-16 03:43 IST"),
            std::string::npos)
      << out_.str();
}

TEST_F(CommandsTest, NodesShowsEachNodesMeasuredRatesBesideTheDataSheet) {
  estimate::RateProbe probe = CpuProbe("Test CPU", 2);
  probe.matmul = {{"fp32", 512, 5e10}};
  probe.memory_bytes_per_s = 1.25e10;
  probe.launch_seconds = 4e-6;
  probe.adamw_8bit_values_per_s = 9e7;
  probe.nf4_dequant_values_per_s = 6e8;
  probe.dropout_values_per_s = 2.5e8;
  probe.loss = {{"aten", "fp32", 2e8}, {"fused", "fp32", 7e8}, {"fused", "bf16", 5e8}};
  // bf16 attention one query past a block, between its 64 tokens' time and 96's.
  probe.sdpa = {{"bf16", 1e10, 64, 64}, {"bf16", 2e10, 128, 64}};
  probe.sdpa_partial_block = {{"bf16", 1e10, 65, 64}};
  // bf16 at new lengths 10 ms slower than at repeated ones: what a new length costs.
  probe.reference_steps = {{"fp32", 0.5, false}, {"bf16", 0.26, true}, {"bf16", 0.25, false}};
  // What a bf16 head's products took from the allocator beside their tensors.
  probe.head_matmul = {{"bf16", 256, 128, 16384, 5e10}};
  probe.head_buffers = {{"bf16", 256, 128, 2048, 165'504, 394'880, 460'544},
                        {"bf16", 256, 128, 16384, 1'321'344, 2'238'848, 3'680'768}};
  // fp32's element-wise product at two tensor sizes; bf16's not measured.
  probe.elementwise = {{"fp32", 1 << 20, 1.25e11}, {"fp32", 256 << 10, 1.5e11}};
  // A layer's element-wise ops under aten at two sizes, fp32 throughout; fused at one, bf16.
  probe.layer_elementwise = {{"fp32", "fp32", "aten", 128, 512, 512, 512, 1408, 0.002},
                             {"fp32", "fp32", "aten", 512, 512, 512, 512, 1408, 0.005},
                             {"bf16", "bf16", "fused", 512, 512, 512, 512, 1408, 0.004}};
  probe.pace_seconds = 0.0011;
  {
    std::lock_guard lock(fake_.mutex_);
    v1::NodeStatus* measured = fake_.nodes_.add_nodes();
    measured->set_name("n1");
    measured->set_state("connected");
    measured->set_rate_probe_json(probe.ToJson().dump());
    fake_.nodes_.add_nodes()->set_name("n2");  // none measured yet: no line
  }
  ASSERT_EQ(Run({"nodes"}), kExitOk) << err_.str();
  const estimate::DeviceSpeed sheet = estimate::CpuSpeed();
  // The factors are rate_probe.h's arithmetic (estimate_probed_speed_test checks it); here, that
  // the line shows them.
  const estimate::DeviceSpeed probed = estimate::ProbedSpeed(sheet, probe, "");
  ASSERT_GT(probed.probed_fp32_factor, 0);
  ASSERT_GT(probed.probed_bf16_factor, 0);
  // No fp32 step at new lengths, and no new-shape cells: bf16's equal parts a weight shape.
  ASSERT_FALSE(probed.fp32_new_length.measured());
  ASSERT_EQ(probed.bf16_new_length.by_values.size(), 1u);
  ASSERT_GT(probed.bf16_new_length.by_values[0].seconds, 0);
  ASSERT_GT(probed.bf16_attention_block_share, 0);
  // The layer cells' rates are rate_probe.h's arithmetic; bf16's first (MatmulClass' order).
  const std::vector<estimate::LayerElementwiseRate>& layers = probed.layer_elementwise;
  ASSERT_EQ(layers.size(), 3u);
  ASSERT_EQ(layers[0].kernels, estimate::Kernels::kFused);
  const double aten_slowest = std::min(layers[1].bytes_per_s, layers[2].bytes_per_s);
  const double aten_fastest = std::max(layers[1].bytes_per_s, layers[2].bytes_per_s);
  ASSERT_NE(std::lround(aten_slowest / 1e9), std::lround(aten_fastest / 1e9));
  // The probe's line, then one line a kind of rate, each indented.
  char expected[1536];
  std::snprintf(
      expected, sizeof expected,
      "\nn1 rates: cpu Test CPU (2 threads, LibTorch 2.15.0), 2026-11-29T01:00:00Z\n"
      "  matmuls fp32 50 GFLOP/s (sheet %.3g), bf16 not measured (sheet %.3g)\n"
      "  memory 12.5 GB/s (sheet %.3g), launch 4 us (sheet %.3g)\n"
      "  element-wise fp32 150 GB/s at 256.00 KiB, 125 GB/s at 1.00 MiB\n"
      "  a layer's element-wise ops (stream/projections) aten fp32/fp32 %.0f-%.0f GB/s; fused "
      "bf16/bf16 %.0f GB/s\n"
      "  attention's partial query block at 0.00 (fp32), %.2f (bf16) of a whole one\n"
      "  loss fp32: ATen 200 M logits/s (sheet %.3g), fused 700 M logits/s (sheet %.3g); bf16: "
      "ATen not measured (sheet %.3g), fused 500 M logits/s (sheet %.3g)\n"
      "  8-bit AdamW 90 M values/s (sheet %.3g), NF4 dequant 600 M values/s (sheet %.3g), dropout "
      "250 M values/s (sheet %.3g)\n"
      "  its reference steps' factors fp32 %.3f, bf16 %.3f, a new length (bf16) %.2f ms a weight "
      "shape + 0.00 ms a micro-batch\n"
      "  a head GEMM's buffers fp32 not measured; bf16 449.75 KiB at 2048 words, 3.51 MiB at "
      "16384 words\n"
      "  the machine's pace: its canary (four fp32 256 x 256 products) in 1.100 ms\n",
      sheet.fp32_flops / 1e9, sheet.bf16_flops / 1e9, sheet.memory_bytes_per_s / 1e9,
      sheet.launch_seconds / 1e-6, aten_slowest / 1e9, aten_fastest / 1e9,
      layers[0].bytes_per_s / 1e9, probed.bf16_attention_block_share,
      sheet.loss_logits_per_s.aten_fp32 / 1e6, sheet.loss_logits_per_s.fused_fp32 / 1e6,
      sheet.loss_logits_per_s.aten_bf16 / 1e6, sheet.loss_logits_per_s.fused_bf16 / 1e6,
      sheet.adamw_8bit_values_per_s / 1e6, sheet.nf4_dequant_values_per_s / 1e6,
      sheet.dropout_values_per_s / 1e6, probed.probed_fp32_factor, probed.probed_bf16_factor,
      probed.bf16_new_length.by_values[0].seconds * 1e3);
  EXPECT_TRUE(out_.str().ends_with(expected)) << out_.str();
  EXPECT_EQ(out_.str().find("n2 rates"), std::string::npos) << out_.str();
}

// With a configured controller, estimate times each trial at the rates of the controller's node
// that could run it (ListNodes) and calibrates with the controller's measured runs (TimedRuns):
// neither this machine's probe nor its embedded store, where none of those trials runs.
TEST_F(CommandsTest, EstimateTimesTrialsAtTheConfiguredControllersNodesAndRuns) {
  estimate::RateProbe probe = CpuProbe("Remote CPU", 16);
  probe.matmul = {{"fp32", 512, 4e11}, {"bf16", 512, 8e11}};
  probe.memory_bytes_per_s = 1e11;
  probe.launch_seconds = 2e-6;
  estimate::StepWork work;
  work.matmul_class = estimate::MatmulClass::kFp32;
  work.tokens = 1024;
  work.micro_batches = 1;
  work.matmul_flops = 1e12;
  work.memory_bytes = 1e9;
  work.launches = 1000;
  {
    std::lock_guard lock(fake_.mutex_);
    v1::NodeStatus* node = fake_.nodes_.add_nodes();
    node->set_name("remote-cpu");
    node->set_state("connected");
    node->set_rate_probe_json(probe.ToJson().dump());
    v1::TimedRun* run = fake_.timed_runs_.add_runs();
    run->set_prediction_json(
        nlohmann::json{{"peak_bytes", 1}, {"time_device", "cpu"}, {"work", work.ToJson()}}.dump());
    run->set_seconds_per_token(0.002);
    run->set_steps(5);
    // Another process's bytes: a time that is not one is no run.
    v1::TimedRun* broken = fake_.timed_runs_.add_runs();
    broken->set_prediction_json(run->prediction_json());
    broken->set_seconds_per_token(-1);
    broken->set_steps(5);
  }
  env_["LLMCTL_HOME"] = (dir_ / "home").string();
  ASSERT_EQ(
      Run({"estimate", "experiments/cpu-lab.yaml", "--trial", "bf16-true", "--format", "json"}),
      kExitOk)
      << err_.str();
  const nlohmann::json time = nlohmann::json::parse(out_.str())["trials"][0]["time"];
  EXPECT_TRUE(time["rates"].get<std::string>().starts_with(
      "node remote-cpu's probe (stored by the controller): cpu Remote CPU (16 threads"))
      << time["rates"];
  EXPECT_EQ(time["calibration"].get<std::string>(),
            "1 measured llama run on cpu (0 bf16, 1 fp32) in the controller at " + target_ +
                " (from LLMCTL_CONTROLLER)")
      << time["calibration"];
  EXPECT_EQ(err_.str(), "");
  EXPECT_FALSE(fs::exists(dir_ / "home")) << "nothing measured or read on this machine";

  // A controller from before TimedRuns: its nodes' rates, the built-in calibration, and a note
  // that says why.
  {
    std::lock_guard lock(fake_.mutex_);
    fake_.timed_runs_unimplemented_ = true;
  }
  ASSERT_EQ(
      Run({"estimate", "experiments/cpu-lab.yaml", "--trial", "bf16-true", "--format", "json"}),
      kExitOk)
      << err_.str();
  const nlohmann::json older = nlohmann::json::parse(out_.str())["trials"][0]["time"];
  EXPECT_TRUE(older["rates"].get<std::string>().starts_with("node remote-cpu's probe"));
  EXPECT_EQ(older["calibration"].get<std::string>().find("in the controller at"),
            std::string::npos);
  EXPECT_EQ(err_.str(), "note: the controller at " + target_ +
                            " (from LLMCTL_CONTROLLER) does not send its measured runs (it "
                            "predates TimedRuns; upgrade llmctld): the time is at the built-in "
                            "calibration\n");

  // A controller that does not answer: notes, and the data sheets' rates.
  const std::string nowhere = "unix:" + (dir_ / "nowhere.sock").string();
  ASSERT_EQ(
      Run({"estimate", "experiments/cpu-lab.yaml", "--trial", "bf16-true", "--format", "json"},
          nowhere),
      kExitOk)
      << err_.str();
  const nlohmann::json sheet = nlohmann::json::parse(out_.str())["trials"][0]["time"];
  EXPECT_FALSE(sheet.contains("rates")) << sheet;
  EXPECT_NE(err_.str().find("note: measured runs not read from the controller at " + nowhere +
                            " (from LLMCTL_CONTROLLER): "),
            std::string::npos)
      << err_.str();
  EXPECT_NE(err_.str().find("note: the nodes' rates not read from the controller at " + nowhere),
            std::string::npos)
      << err_.str();
}

}  // namespace
}  // namespace llmctl::cli
