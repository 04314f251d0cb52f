// Bad input stops at the edge, the same way at both front doors: every experiment file of the two
// broken corpora (tests/fixtures/broken_inputs/, inputs that exist but are wrong, made by
// scripts/fixtures/make_broken_inputs.py; tests/fixtures/experiments/broken/, files that do not
// parse) is refused by the built `llm-train --config FILE` and by `llmctl submit FILE` with exit 2
// and one message naming the file at fault (and its line where it has one), by neither a signal
// nor a hang (each run is killed after a minute, which fails the case), and nothing reaches the
// controller: `llmctl status` afterwards lists no experiment.
//
// llm-train gets every broken input but only one file of each kind of the files that do not
// parse (kLlmTrainParseCases): each of those fails in LoadExperimentFile, the first thing
// llm-train does with --config (its main prints the message and exits 2), and
// BrokenExperimentCorpusTest (common/experiment_test.cc) checks that function's message for every
// one of them. The rest would check the same again at 0.8 s of CPU a run, nearly all of it
// LibTorch loading (as much as `llm-train --version`).
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

#include "tests/support/shell_command.h"

namespace {

namespace fs = std::filesystem;
using llmctl::testing::BuildDir;
using llmctl::testing::CommandResult;

struct BrokenCase {
  fs::path file;
  std::string refused;    // text both messages must hold
  bool llm_train = true;  // false: llmctl submit only (the file comment says why)
};

// Files of tests/fixtures/experiments/broken/ that llm-train refuses here too: a YAML syntax
// error, an empty file, an unknown key, a check across keys, a model directory read while
// parsing, two documents in one file.
constexpr std::string_view kLlmTrainParseCases[] = {
    "yaml_syntax.yaml",           "empty_file.yaml",
    "unknown_top_level_key.yaml", "global_not_multiple_of_micro.yaml",
    "model_dir_bad_config.yaml",  "two_documents.yaml"};

std::string ReadFile(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

std::string FirstLine(const std::string& text) { return text.substr(0, text.find('\n')); }

// tests/fixtures/broken_inputs/*.yaml start with "# refused: TEXT"; experiments/broken/*.yaml
// have TEXT in a .expected file beside them.
std::vector<BrokenCase> Corpus() {
  std::vector<BrokenCase> cases;
  for (const fs::directory_entry& entry : fs::directory_iterator("tests/fixtures/broken_inputs")) {
    if (entry.path().extension() != ".yaml") continue;
    const std::string first = FirstLine(ReadFile(entry.path()));
    constexpr std::string_view kPrefix = "# refused: ";
    EXPECT_TRUE(first.starts_with(kPrefix)) << entry.path();
    cases.push_back({entry.path(), first.substr(std::min(first.size(), kPrefix.size()))});
  }
  for (const fs::directory_entry& entry :
       fs::directory_iterator("tests/fixtures/experiments/broken")) {
    if (entry.path().extension() != ".yaml") continue;
    fs::path expected = entry.path();
    expected.replace_extension(".expected");
    const bool llm_train =
        std::find(std::begin(kLlmTrainParseCases), std::end(kLlmTrainParseCases),
                  entry.path().filename().string()) != std::end(kLlmTrainParseCases);
    cases.push_back({entry.path(), FirstLine(ReadFile(expected)), llm_train});
  }
  std::sort(cases.begin(), cases.end(),
            [](const BrokenCase& a, const BrokenCase& b) { return a.file < b.file; });
  return cases;
}

class BrokenInputsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    for (const fs::path& binary :
         {BuildDir() / "controller" / "llmctld", BuildDir() / "trainer" / "llm-train",
          BuildDir() / "agent" / "llm-agent"}) {
      ASSERT_TRUE(fs::exists(binary)) << binary << " is not built";
    }
    char pattern[] = "/tmp/llmctl-broken-XXXXXX";
    ASSERT_NE(::mkdtemp(pattern), nullptr);
    home_ = pattern;
  }
  void TearDown() override {
    if (home_.empty()) return;
    Llmctl("daemon stop");
    fs::remove_all(home_);
  }

  // A hang is a failure, not a stuck suite: the run is killed after a minute (exit code -1).
  CommandResult Run(const std::string& command) {
    return llmctl::testing::RunShellCommand(
        "env -u LLMCTL_CONTROLLER LLMCTL_HOME=" + home_.string() +
        " LLMCTL_CACHE_DIR=" + (home_ / "cache").string() +
        " XDG_CONFIG_HOME=" + (home_ / "config").string() + " timeout -s KILL 60 " + command);
  }
  CommandResult Llmctl(const std::string& args) {
    return Run((BuildDir() / "controller" / "cli" / "llmctl").string() + " " + args);
  }
  CommandResult LlmTrain(const fs::path& file) {
    return Run((BuildDir() / "trainer" / "llm-train").string() + " --config " + file.string());
  }

  // Both front doors (llmctl submit alone where `llm_train` is false) refuse `file` with exit 2
  // and `refused` in their one-line message.
  void ExpectRefused(const fs::path& file, const std::string& refused, bool llm_train = true) {
    SCOPED_TRACE(file.string());
    if (llm_train) {
      const CommandResult trained = LlmTrain(file);
      EXPECT_EQ(trained.exit_code, 2) << trained.out;
      EXPECT_NE(trained.out.find(refused), std::string::npos)
          << "llm-train said: " << trained.out << "expected: " << refused;
      ++trained_;
    }
    const CommandResult submitted = Llmctl("submit " + file.string());
    EXPECT_EQ(submitted.exit_code, 2) << submitted.out;
    EXPECT_NE(submitted.out.find(refused), std::string::npos)
        << "llmctl submit said: " << submitted.out << "expected: " << refused;
    EXPECT_TRUE(submitted.out.starts_with("llmctl: ")) << submitted.out;
    EXPECT_EQ(submitted.out.find('\n'), submitted.out.size() - 1) << "one line: " << submitted.out;
    ++checked_;
  }

  fs::path home_;
  int checked_ = 0;
  int trained_ = 0;
};

TEST_F(BrokenInputsTest, BothFrontDoorsRefuseEveryCaseAndStoreNothing) {
  const std::vector<BrokenCase> cases = Corpus();
  ASSERT_GE(cases.size(), 40u + 40u);
  for (const BrokenCase& c : cases) ExpectRefused(c.file, c.refused, c.llm_train);
  // Each file named in kLlmTrainParseCases is in the corpus: a renamed one would leave llm-train.
  EXPECT_EQ(std::count_if(cases.begin(), cases.end(),
                          [](const BrokenCase& c) {
                            return c.llm_train && c.file.parent_path().filename() == "broken";
                          }),
            std::ssize(kLlmTrainParseCases));

  // A named pipe cannot live in git: made here, with an experiment naming it. Opening it for
  // reading would wait for a writer forever; it is refused without being opened.
  const fs::path fifo = home_ / "data.jsonl";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  const fs::path fifo_experiment = home_ / "fifo.yaml";
  std::ofstream(fifo_experiment) << "model: llmctl-demo\ninit: random\n"
                                 << "tokenizer: " << fs::absolute("experiments/tokenizers/demo")
                                 << "\ndata: {path: " << fifo.string() << "}\n";
  ExpectRefused(fifo_experiment, "data.jsonl");

  // Nothing reached the controller: the first status call starts the embedded one, which has
  // nothing.
  const CommandResult status = Llmctl("status");
  EXPECT_EQ(status.exit_code, 0) << status.out;
  EXPECT_NE(status.out.find("no experiments"), std::string::npos) << status.out;
  std::printf("%d broken experiment files refused by llmctl submit, %d of them by llm-train too\n",
              checked_, trained_);
}

}  // namespace
