// Fuzz target for the agent's side of event lines: LineSplitter (agent/event_reader.h) over any
// bytes, fed in pieces as a growing file is read, then event_line::Accept on each line, as
// StreamEvents sends them (agent/server.cc). Never a crash, and:
// - the splitter never holds more than its cap of an unfinished line;
// - it returns exactly the input's complete lines, in order, each with its size as written, whole
//   when within the cap and empty (its size only) when over it;
// - each line goes on unchanged when it keeps the rule, else as exactly one well-formed
//   refused_line event of its size (event_line_checks.h).
// The first input byte sets the piece size and a small cap (so that overlong lines are common);
// the rest is the file.
//
// Replayed over tests/fuzz/corpus/event_line_agent/ by the `event_line_agent_fuzz_replay` test.
// To fuzz for real (clang with libFuzzer), from the repository root, in bash:
//
//   SRCS="tests/fuzz/event_line_agent_fuzz.cc agent/event_reader.cc common/event_line.cc
//         common/text.cc common/status.cc common/foreign_json.cc common/files.cc
//         common/errno_status.cc common/byte_size.cc common/atomic_file.cc"
//   clang++ -std=c++20 -g -O1 -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=all -I.
//       $SRCS -o /tmp/event_line_agent_fuzz                                    # (one line)
//   mkdir -p /tmp/event_line_agent_corpus
//   /tmp/event_line_agent_fuzz -max_total_time=180 -max_len=4096 /tmp/event_line_agent_corpus
//       tests/fuzz/corpus/event_line_agent
//
// Inputs that crash go into the corpus with the fix, named by their sha1.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "agent/event_reader.h"
#include "common/event_line.h"
#include "tests/fuzz/event_line_checks.h"

using llmctl::event_line_fuzz::Check;
using llmctl::event_line_fuzz::CheckPassedOn;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const size_t piece = 1 + data[0] % 16;
  const int64_t cap = 1 + data[0] / 16;  // 1..16 bytes
  const std::string_view file(reinterpret_cast<const char*>(data) + 1, size - 1);

  llmctl::agent::LineSplitter splitter(cap);
  std::vector<llmctl::agent::EventLine> lines;
  for (size_t at = 0; at < file.size(); at += piece) {
    splitter.Feed(file.substr(at, piece), lines);
    Check(static_cast<int64_t>(splitter.held_bytes()) <= cap);
  }
  // The input's complete lines, as a whole-file split sees them.
  std::vector<std::string_view> expected;
  for (size_t start = 0, end; (end = file.find('\n', start)) != std::string_view::npos;
       start = end + 1) {
    expected.push_back(file.substr(start, end - start));
  }
  Check(lines.size() == expected.size());
  for (size_t i = 0; i < lines.size(); ++i) {
    const auto written = static_cast<int64_t>(expected[i].size());
    Check(lines[i].bytes == written);
    Check(written <= cap ? lines[i].text == expected[i] : lines[i].text.empty());
    const std::string text = lines[i].text;
    const llmctl::event_line::Accepted accepted =
        llmctl::event_line::Accept(lines[i].text, lines[i].bytes);
    // The rule's cap is the real one: a line over this target's small cap arrives empty and is
    // refused for that (an empty line is no JSON), with its size as written.
    CheckPassedOn(text, lines[i].bytes, accepted.type, accepted.json, accepted.refusal);
  }
  // The whole input as one line, as a reader with the real cap hands it on.
  const llmctl::event_line::Accepted whole = llmctl::event_line::Accept(std::string(file));
  CheckPassedOn(file, static_cast<int64_t>(file.size()), whole.type, whole.json, whole.refusal);
  return 0;
}
