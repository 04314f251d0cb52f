// The two-trial experiment of the built-in model that the controller API's tests
// (controller_service_test_support.h) and its fuzz target (tests/fuzz/controller_rpc_fuzz.cc)
// submit; apart from the test support so that the fuzz target, which links no GoogleTest, shares
// it.
#ifndef LLMCTL_CONTROLLER_TEST_EXPERIMENT_H_
#define LLMCTL_CONTROLLER_TEST_EXPERIMENT_H_

#include <string_view>

namespace llmctl::controller::test_support {

inline constexpr std::string_view kExperiment = R"(name: tiny
model: llmctl-demo
tokenizer: tok.json
data: {path: data/train.jsonl, max_seq_length: 64}
train: {micro_batch_size: 2, max_steps: 2}
trials:
  - name: a
  - name: b
    set: {precision: bf16-true}
)";

}  // namespace llmctl::controller::test_support

#endif  // LLMCTL_CONTROLLER_TEST_EXPERIMENT_H_
