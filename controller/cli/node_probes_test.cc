// The nodes' stored probes as the estimate takes them (controller/cli/local_rates.h): a stored
// node's probe serves before this machine's, the embedded agent's copy does not stand in for
// probe.json, the target picks the node whose lease matches it, and a configured controller's
// nodes come through ListNodes, hostile ones shown without their controls.
#include <gtest/gtest.h>

#include "controller/cli/local_rates.h"
#include "controller/cli/local_rates_test_support.h"

namespace llmctl::cli::local_rates_test {
namespace {

// A node's stored probe serves before this machine's (probe.json) and measures nothing here; the
// estimate's step is its work over the node's rates, and its time names the node. A GPU trial
// takes the probe of a node with that GPU; a GPU the store has no probe of keeps its data sheet.
// (The embedded agent's, node "local", is this machine's own: the next test.)
TEST_F(LocalRatesTest, AStoredNodeProbeServesBeforeThisMachinesAndTheEstimateSaysWhich) {
  estimate::RateProbe node = FixedProbe();
  node.matmul = {{"fp32", 512, 2e10}, {"bf16", 512, 4e9}};
  node.memory_bytes_per_s = 5e9;
  node.launch_seconds = 8e-6;
  node.loss = {{"aten", "bf16", 2e8}};
  estimate::RateProbe gpu = FixedProbe();
  gpu.device = "cuda";
  gpu.loss.clear();  // a CPU's
  gpu.device_name = KnownGpu().model;
  gpu.matmul = {{"fp32", 512, 3e13}, {"bf16", 512, 2e14}};
  gpu.memory_bytes_per_s = 2e12;
  StoreNodeRates(home_, {{"cpu-1", node}, {"gpu-1", gpu}});
  std::ofstream(home_ / "probe.json") << FixedProbe().ToJson().dump(2);

  std::ostringstream err;
  const LocalRates rates = LocalRates::LoadOnFirstUse(Env(), home_ / "no-such" / "llmctl", err);
  const estimate::DeviceSpeed on_gpu = rates.For(estimate::GpuSpeed(KnownGpu()));
  EXPECT_EQ(on_gpu.bf16_flops, 2e14);
  EXPECT_TRUE(on_gpu.rates.starts_with("node gpu-1's probe (stored by the controller): cuda "))
      << on_gpu.rates;
  for (const estimate::Gpu& other : estimate::KnownGpus()) {
    if (other.name != KnownGpu().name) {
      EXPECT_EQ(rates.For(estimate::GpuSpeed(other)).rates, "") << other.name;
    }
  }

  const auto [without, with] = Bf16TrueTimes(rates);
  ASSERT_FALSE(with.is_null());
  EXPECT_EQ(err.str(), "") << "nothing measured, nothing to say";
  EXPECT_TRUE(with["rates"].get<std::string>().starts_with(
      "node cpu-1's probe (stored by the controller): cpu "))
      << with["rates"];
  const nlohmann::json& work = with["work"];
  EXPECT_EQ(work, without["work"]);
  ASSERT_EQ(work["matmul_class"], "bf16");
  const double expected =
      work["matmul_flops"].get<double>() / 4e9 + work["memory_bytes"].get<double>() / 5e9 +
      work["loss_logits"].get<double>() / 2e8 + work["launches"].get<double>() * 8e-6;
  EXPECT_NEAR(with["step_seconds"].get<double>(), expected, 1e-9 * expected);

  // Off keeps the data sheets, stored probes too.
  const EnvLookup off = [home =
                             home_.string()](std::string_view name) -> std::optional<std::string> {
    if (name == "LLMCTL_HOME") return home;
    if (name == kRateProbeVariable) return "off";
    return std::nullopt;
  };
  const LocalRates sheets = LocalRates::LoadOnFirstUse(off, home_ / "no-such" / "llmctl", err);
  EXPECT_EQ(sheets.For(estimate::GpuSpeed(KnownGpu())).rates, "");
  EXPECT_EQ(sheets.For(estimate::CpuSpeed()).rates, "");
}

// The embedded agent's stored probe (node "local") is its copy of this machine's probe.json: the
// file serves in its place, before another CPU's node as the copy did, and deleting it measures
// again (a probe taken at a bad moment), where the copy would have served on and nothing been
// measured. Where this machine's cannot be had, the copy serves, and the note says so.
TEST_F(LocalRatesTest, TheEmbeddedAgentsCopyDoesNotStandInForThisMachinesProbe) {
  estimate::RateProbe copy = FixedProbe();
  copy.memory_bytes_per_s = 3e9;  // the bad moment's
  estimate::RateProbe far = FixedProbe();
  far.device_name = "Another CPU";
  far.memory_bytes_per_s = 4e9;
  StoreNodeRates(home_, {{"cpu-far", far}, {std::string(kLocalNode), copy}});
  const fs::path bin = home_ / "bin";
  fs::create_directories(bin);
  std::ofstream(home_ / "fixed.json") << FixedProbe().ToJson().dump(2);
  const std::string runs = (home_ / "runs.txt").string();
  for (const char* name : {"llmctld", "llm-agent", "llm-train"}) {
    std::ofstream(bin / name) << StandInStart() << "echo run >> '" << runs << "'\ncat '"
                              << (home_ / "fixed.json").string() << "' > \"$3\"\n";
    fs::permissions(bin / name, fs::perms::owner_all);
  }
  std::ostringstream err;
  const LocalRates rates = LocalRates::LoadOnFirstUse(Env(), bin / "llmctl", err);
  const estimate::DeviceSpeed cpu = rates.For(estimate::CpuSpeed());
  EXPECT_EQ(cpu.memory_bytes_per_s, 1e10);
  EXPECT_TRUE(cpu.rates.starts_with("this machine's probe (" + (home_ / "probe.json").string()))
      << cpu.rates;
  std::ifstream measured(runs);
  EXPECT_EQ(std::string(std::istreambuf_iterator<char>(measured), {}), "run\n") << err.str();
  EXPECT_NE(err.str().find("measuring this machine's rates once"), std::string::npos) << err.str();

  fs::remove(home_ / "probe.json");
  std::ostringstream unmeasured;
  const LocalRates copied =
      LocalRates::LoadOnFirstUse(Env(), home_ / "no-such" / "llmctl", unmeasured);
  const estimate::DeviceSpeed at_copy = copied.For(estimate::CpuSpeed());
  EXPECT_EQ(at_copy.memory_bytes_per_s, 3e9);
  EXPECT_TRUE(at_copy.rates.starts_with("node local's probe (stored by the controller): cpu "))
      << at_copy.rates;
  EXPECT_NE(unmeasured.str().find(
                "note: the time is at the embedded agent's stored copy of this machine's rates: "),
            std::string::npos)
      << unmeasured.str();
}

// The node a trial is timed on is one that could run it: its probe of the trial's device, and its
// lease matching the experiment's target as the scheduler matches it (site and flavor). A CPU
// trial with a target never runs on this machine's embedded agent (it has no lease), so this
// machine's probe does not serve it.
TEST_F(LocalRatesTest, TheTargetPicksTheNodeWhoseLeaseMatchesIt) {
  estimate::RateProbe tacc = FixedProbe();
  tacc.device = "cuda";
  tacc.loss.clear();  // a CPU's
  tacc.device_name = KnownGpu().model;
  tacc.matmul = {{"fp32", 512, 3e13}, {"bf16", 512, 2e14}};
  estimate::RateProbe uc = tacc;
  uc.matmul = {{"fp32", 512, 3e13}, {"bf16", 512, 1e14}};
  StoreNodeRates(home_, {{"gpu-tacc", tacc}, {"gpu-uc", uc}});
  {
    StatusOr<std::unique_ptr<store::Store>> store =
        store::Store::Open((home_ / "llmctl.db").string());
    ASSERT_TRUE(store.ok());
    ASSERT_TRUE((*store)->SetNodeLease("gpu-tacc", {"l1", "KVM@TACC", "g1.h100.pci.1", {}}).ok());
    ASSERT_TRUE((*store)->SetNodeLease("gpu-uc", {"l2", "CHI@UC", "gpu_h100", {}}).ok());
  }
  std::ofstream(home_ / "probe.json") << FixedProbe().ToJson().dump(2);
  std::ostringstream err;
  const LocalRates rates = LocalRates::LoadOnFirstUse(Env(), home_ / "no-such" / "llmctl", err);
  const estimate::DeviceSpeed gpu = estimate::GpuSpeed(KnownGpu());

  EXPECT_EQ(rates.For(gpu, {{"site", "CHI@UC"}}).bf16_flops, 1e14);
  EXPECT_TRUE(rates.For(gpu, {{"site", "CHI@UC"}}).rates.starts_with("node gpu-uc's probe"));
  EXPECT_EQ(rates.For(gpu, {{"site", "KVM@TACC"}, {"flavor", "g1.h100.pci.1"}}).bf16_flops, 2e14);
  // node_type is not a label: it narrows nothing, as in placement.
  EXPECT_EQ(rates.For(gpu, {{"node_type", "gpu_h100"}}).bf16_flops, 2e14);
  EXPECT_EQ(rates.For(gpu).bf16_flops, 2e14) << "no target: the first node by name";
  EXPECT_EQ(rates.For(gpu, {{"site", "CHI@TACC"}}).rates, "") << "no such node: the data sheet";

  // This machine's probe serves an untargeted CPU trial, not a targeted one.
  EXPECT_EQ(rates.For(estimate::CpuSpeed()).fp32_flops, 5e10);
  EXPECT_EQ(rates.For(estimate::CpuSpeed(), {{"site", "CHI@UC"}}).rates, "");
  EXPECT_EQ(err.str(), "");
}

// A configured controller's nodes come through ListNodes: another process's bytes. A probe that
// does not parse is named and skipped; connected nodes come before the others.
TEST(NodeProbesOfTest, ParsesEachNodesProbeWithItsLeaseConnectedFirst) {
  v1::ListNodesResponse nodes;
  const auto add = [&nodes](const std::string& name, const std::string& state,
                            const std::string& probe_json) {
    v1::NodeStatus* node = nodes.add_nodes();
    node->set_name(name);
    node->set_state(state);
    node->set_rate_probe_json(probe_json);
    return node;
  };
  estimate::RateProbe probe = FixedProbe();
  add("a-away", "unreachable", probe.ToJson().dump());
  v1::NodeStatus* leased = add("b-here", "connected", probe.ToJson().dump());
  leased->mutable_lease()->set_site("CHI@UC");
  leased->mutable_lease()->set_flavor("gpu_h100");
  add("c-broken", "connected", "{\"device\": 7}");
  add("d-torn", "connected", "{ torn");
  add("e-none", "connected", "");

  std::ostringstream err;
  const std::vector<NodeProbe> parsed = NodeProbesOf(nodes, err);
  ASSERT_EQ(parsed.size(), 2u);
  EXPECT_EQ(parsed[0].node, "b-here");
  EXPECT_EQ(parsed[0].labels,
            (std::map<std::string, std::string>{{"site", "CHI@UC"}, {"flavor", "gpu_h100"}}));
  EXPECT_EQ(parsed[1].node, "a-away");
  EXPECT_TRUE(parsed[1].labels.empty());
  EXPECT_NE(err.str().find("note: node c-broken's rates are not used: "), std::string::npos)
      << err.str();
  EXPECT_NE(err.str().find("note: node d-torn's rates are not used: not JSON"), std::string::npos)
      << err.str();
  EXPECT_EQ(err.str().find("e-none"), std::string::npos) << "no probe is nothing to say";
}

// A controller's node names and probes are another party's: a note about them stays one line
// without their controls, and a probe whose versions would print them is not used.
TEST(NodeProbesOfTest, NotesShowAHostileNodeWithoutItsControls) {
  v1::ListNodesResponse nodes;
  v1::NodeStatus* torn = nodes.add_nodes();
  torn->set_name("n\x1b]0;T\x07\nFORGED\u202e");
  torn->set_state("connected");
  torn->set_rate_probe_json("{ torn");
  nlohmann::ordered_json forged = FixedProbe().ToJson();
  forged["identity"]["versions"]["libtorch"] = "2.15.0\x1b]0;T\x07\x1b[2J\r\nFORGED LINE";
  v1::NodeStatus* lying = nodes.add_nodes();
  lying->set_name("lying");
  lying->set_state("connected");
  lying->set_rate_probe_json(forged.dump());

  std::ostringstream err;
  EXPECT_TRUE(NodeProbesOf(nodes, err).empty());
  EXPECT_NE(err.str().find("note: node n ]0;T  FORGED 's rates are not used: not JSON"),
            std::string::npos)
      << err.str();
  EXPECT_NE(err.str().find("note: node lying's rates are not used: "), std::string::npos)
      << err.str();
  EXPECT_EQ(err.str().find('\x1b'), std::string::npos) << err.str();
  EXPECT_EQ(err.str().find("\nFORGED"), std::string::npos) << err.str();
  EXPECT_EQ(err.str().find("\u202e"), std::string::npos) << err.str();
}

}  // namespace
}  // namespace llmctl::cli::local_rates_test
