// The embedded default end to end: the built `llmctl` starts llmctld and llm-agent in a fresh data
// directory, registers the agent, submits an experiment whose data and tokenizer live on "the
// user's machine" (uploaded as input trees), waits for it, reports it as JSON, submits it again
// (nothing left to upload) and stops both daemons. Real processes, real gRPC on unix sockets, real
// SQLite, a real llm-train run of the demo model for two steps.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "tests/support/shell_command.h"

namespace {

namespace fs = std::filesystem;
using llmctl::testing::CommandResult;

fs::path BuildDir() {
  const char* dir = std::getenv("LLMCTL_BUILD_DIR");
  return fs::absolute(dir != nullptr ? dir : "build");  // ctest runs in the source directory
}

class EmbeddedLlmctlTest : public ::testing::Test {
 protected:
  void SetUp() override {
    for (const fs::path& binary :
         {BuildDir() / "controller" / "llmctld", BuildDir() / "trainer" / "llm-train"}) {
      if (!fs::exists(binary)) GTEST_SKIP() << binary << " is not built";
    }
    char pattern[] = "/tmp/llmctl-embedded-XXXXXX";
    ASSERT_NE(::mkdtemp(pattern), nullptr);
    home_ = pattern;
  }
  void TearDown() override {
    if (home_.empty()) return;
    Llmctl("daemon stop");  // whatever happened above, no daemon outlives the test
    fs::remove_all(home_);
  }

  CommandResult Llmctl(const std::string& args) {
    const std::string command = "env -u LLMCTL_CONTROLLER LLMCTL_HOME=" + home_.string() +
                                " XDG_CONFIG_HOME=" + (home_ / "config").string() + " " +
                                (BuildDir() / "controller" / "cli" / "llmctl").string() + " " +
                                args;
    return llmctl::testing::RunShellCommand(command);
  }

  fs::path home_;
};

TEST_F(EmbeddedLlmctlTest, SubmitWaitReportAndStop) {
  const fs::path user = home_ / "user";
  fs::create_directories(user);
  fs::copy_file("experiments/data/alpaca-demo.jsonl", user / "train.jsonl");
  fs::copy_file("experiments/tokenizers/demo/tokenizer.json", user / "tokenizer.json");
  std::ofstream(user / "tiny.yaml") << "model: llmctl-demo\n"
                                       "init: random\n"
                                       "tokenizer: tokenizer.json\n"
                                       "data: {path: train.jsonl, max_seq_length: 64}\n"
                                       "train: {micro_batch_size: 2, max_steps: 2}\n"
                                       "trials:\n"
                                       "  - name: squeezed\n"
                                       "    set: {device_memory: 6MiB}\n"
                                       "    expect: oom\n"
                                       "  - {name: tiny, expect: ok}\n";

  CommandResult submitted = Llmctl("submit " + (user / "tiny.yaml").string() + " --wait");
  ASSERT_EQ(submitted.exit_code, 0) << submitted.out;
  const std::string id = submitted.out.substr(0, submitted.out.find('\n'));
  EXPECT_NE(submitted.out.find("2 trees, 2 files, 2 uploaded"), std::string::npos) << submitted.out;
  // --wait exits 0 only when every trial ended as its `expect:` says.

  CommandResult report = Llmctl("report " + id + " --format json");
  ASSERT_EQ(report.exit_code, 0);
  const nlohmann::json json = nlohmann::json::parse(report.out);
  ASSERT_EQ(json["trials"].size(), 2u);
  // The trial that ran out of memory is stored as oom with the snapshot taken when the allocation
  // failed, and the next trial on the same agent still ran.
  const nlohmann::json& squeezed = json["trials"][0];
  EXPECT_EQ(squeezed["name"], "squeezed");
  EXPECT_EQ(squeezed["outcome"], "oom");
  EXPECT_GT(squeezed["at_peak"]["params_bytes"].get<int64_t>(), 0);
  EXPECT_LE(squeezed["at_peak"]["allocated_bytes"].get<int64_t>(), 6 << 20);
  const nlohmann::json& trial = json["trials"][1];
  EXPECT_EQ(trial["outcome"], "ok");
  EXPECT_EQ(trial["expected"], "ok");
  EXPECT_GT(trial["peak_bytes"].get<int64_t>(), 0);
  EXPECT_GT(trial["at_peak"]["params_bytes"].get<int64_t>(), 0);
  EXPECT_FALSE(trial["per_phase"].empty());
  EXPECT_TRUE(trial["final_loss"].is_number());

  // The daemons stayed up; the inputs are already there.
  CommandResult again = Llmctl("submit " + (user / "tiny.yaml").string());
  ASSERT_EQ(again.exit_code, 0) << again.out;
  EXPECT_NE(again.out.find("2 files, 0 uploaded (0 bytes)"), std::string::npos) << again.out;

  CommandResult stopped = Llmctl("daemon stop");
  EXPECT_EQ(stopped.exit_code, 0);
  EXPECT_NE(stopped.out.find("llm-agent (pid"), std::string::npos) << stopped.out;
  EXPECT_NE(stopped.out.find("llmctld (pid"), std::string::npos) << stopped.out;
  CommandResult status = Llmctl("daemon status");
  EXPECT_NE(status.out.find("llmctld: stopped"), std::string::npos) << status.out;
  EXPECT_NE(status.out.find("llm-agent: stopped"), std::string::npos) << status.out;
}

}  // namespace
