// What the llmctld fuzz targets (controller_rpc_fuzz.cc, controller_stream_fuzz.cc) start their
// controller with.
#ifndef LLMCTL_TESTS_FUZZ_CONTROLLER_FIXTURE_H_
#define LLMCTL_TESTS_FUZZ_CONTROLLER_FIXTURE_H_

#include <spdlog/spdlog.h>

#include <filesystem>
#include <memory>
#include <utility>

#include "controller/clock.h"
#include "controller/config.h"
#include "controller/daemon.h"
#include "tests/fuzz/rpc_checks.h"

namespace llmctl::rpc_fuzz {

// llmctld without its dispatcher, its data in root/data and its socket root/run/controller.sock.
// It logs warnings only, not a line per call that succeeds: the checks read the answers.
inline std::unique_ptr<controller::Daemon> StartController(const std::filesystem::path& root,
                                                           const controller::Clock& clock) {
  spdlog::set_level(spdlog::level::warn);
  controller::ControllerConfig config;
  config.data_dir = (root / "data").string();
  config.listen = "unix:" + (root / "run" / "controller.sock").string();
  auto daemon = controller::Daemon::Start(config, clock, {.run_dispatcher = false});
  Check(daemon.ok(), "the controller starts");
  return std::move(*daemon);
}

}  // namespace llmctl::rpc_fuzz

#endif  // LLMCTL_TESTS_FUZZ_CONTROLLER_FIXTURE_H_
