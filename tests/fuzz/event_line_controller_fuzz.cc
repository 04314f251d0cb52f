// Fuzz target for the controller's side of event lines: dispatch::StoredEvent
// (controller/dispatch/event_streams.h), which turns what an agent sent into the event the store
// keeps, on any line and any type the agent claims. Never a crash, and what is stored keeps the seq
// and rank sent and is the line itself when it keeps the rule, else exactly one well-formed
// refused_line event of its size (event_line_checks.h). The first input byte up to a '\n' is the
// type the agent claims; the rest is the line.
//
// Replayed over tests/fuzz/corpus/event_line_controller/ by the `event_line_controller_fuzz_replay`
// test. A libFuzzer build links the controller library: configure a build directory with
// CC=clang CXX=clang++ and CXXFLAGS="-fsanitize=fuzzer-no-link,address,undefined", build
// llmctl_controller, then link this file with -fsanitize=fuzzer against it (as
// event_line_controller_fuzz_replay is linked, replay_main.cc left out: its link line is the last
// of `ninja -C DIR -t commands event_line_controller_fuzz_replay`).
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "common/event_line.h"
#include "controller/dispatch/event_streams.h"
#include "tests/fuzz/event_line_checks.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view input(reinterpret_cast<const char*>(data), size);
  const size_t newline = input.find('\n');
  const std::string_view claimed =
      newline == std::string_view::npos ? "" : input.substr(0, newline);
  const std::string_view line =
      newline == std::string_view::npos ? input : input.substr(newline + 1);
  llmctl::v1::TrialEvent sent;
  sent.set_seq(static_cast<int64_t>(size) + 1);
  sent.set_rank(static_cast<int32_t>(size % 3));
  sent.set_type(std::string(claimed));
  sent.set_json(std::string(line));
  std::string refusal;
  const llmctl::store::Event stored = llmctl::controller::dispatch::StoredEvent(sent, refusal);
  llmctl::event_line_fuzz::Check(stored.seq == sent.seq() && stored.rank == sent.rank());
  llmctl::event_line_fuzz::CheckPassedOn(line, static_cast<int64_t>(line.size()), stored.type,
                                         stored.json, refusal);
  return 0;
}
