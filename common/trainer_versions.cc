#include "common/trainer_versions.h"

#include <nlohmann/json.hpp>

#include "common/foreign_json.h"
#include "common/run_command.h"
#include "common/text.h"

namespace llmctl {
namespace {

using Json = nlohmann::json;

struct StringField {
  const char* key;
  std::string TrainerVersions::*member;
  bool required;
};

constexpr StringField kStringFields[] = {
    {"llmctl", &TrainerVersions::llmctl, true},
    {"libtorch", &TrainerVersions::libtorch, true},
    {"libtorch_cuda", &TrainerVersions::libtorch_cuda, false},
    {"cuda_runtime", &TrainerVersions::cuda_runtime, false},
    {"nvidia_driver", &TrainerVersions::nvidia_driver, false},
    {"driver_cuda", &TrainerVersions::driver_cuda, false},
    {"aten_cpu_capability", &TrainerVersions::aten_cpu_capability, false},
    {"onednn_isa_cap", &TrainerVersions::onednn_isa_cap, false},
};

struct CountField {
  const char* key;
  int TrainerVersions::*member;
};

constexpr CountField kCountFields[] = {
    {"cuda_devices", &TrainerVersions::cuda_devices},
    {"cpu_threads", &TrainerVersions::cpu_threads},
};

// A version is a few words ("2.15.0+cu132", "580.95.05"); `llmctl nodes`, estimate and plan print
// them.
constexpr size_t kMaxVersionBytes = 64;

}  // namespace

std::string TrainerVersions::Summary() const {
  return "llm-train " + llmctl + " (LibTorch " + libtorch +
         (cuda_devices > 0 ? ", CUDA available" : ", no CUDA device") + ")";
}

std::string TrainerVersions::CpuKernels() const {
  if (cpu_threads <= 0) return "";
  std::string kernels = std::to_string(cpu_threads) + (cpu_threads == 1 ? " thread" : " threads") +
                        ", ATen " + aten_cpu_capability;
  if (!onednn_isa_cap.empty()) kernels += ", oneDNN at most " + onednn_isa_cap;
  return kernels;
}

std::string TrainerVersions::CpuKernelsOrUnrecorded() const {
  const std::string kernels = CpuKernels();
  return kernels.empty() ? "threads and kernels not recorded" : kernels;
}

std::string TrainerVersions::ToText() const {
  std::string text = Summary() + "\n";
  if (const std::string kernels = CpuKernels(); !kernels.empty()) {
    text += "CPU: " + kernels + "\n";
  }
  if (!libtorch_cuda.empty()) text += "LibTorch built for CUDA " + libtorch_cuda + "\n";
  std::string runtime;
  if (!cuda_runtime.empty()) runtime = "CUDA runtime " + cuda_runtime;
  if (!nvidia_driver.empty()) {
    runtime += (runtime.empty() ? "" : ", ") + std::string("NVIDIA driver ") + nvidia_driver;
    if (!driver_cuda.empty()) runtime += " (supports CUDA up to " + driver_cuda + ")";
  }
  if (!runtime.empty()) text += runtime + "\n";
  return text;
}

std::string TrainerVersions::ToJson() const {
  Json json = Json::object();
  for (const StringField& field : kStringFields) json[field.key] = this->*field.member;
  for (const CountField& field : kCountFields) json[field.key] = this->*field.member;
  return json.dump();
}

StatusOr<TrainerVersions> ParseTrainerVersions(std::string_view text) {
  const std::string where = "llm-train --version --json";
  const Json json = ParseForeignJson(text);
  if (!json.is_object()) {
    return InvalidArgumentError(where + ": not a JSON object: '" + OnOneLine(text, 200) + "'");
  }
  TrainerVersions versions;
  for (const StringField& field : kStringFields) {
    auto value = json.find(field.key);
    if (value == json.end() && !field.required) continue;
    if (value == json.end() || !value->is_string()) {
      return InvalidArgumentError(where + ": '" + field.key + "' is " +
                                  (value == json.end() ? "missing" : "not a string"));
    }
    versions.*field.member = value->get<std::string>();
    if (const std::string problem = PrintableTextProblem(versions.*field.member, kMaxVersionBytes);
        !problem.empty()) {
      return InvalidArgumentError(where + ": '" + field.key + "' " + problem);
    }
  }
  for (const CountField& field : kCountFields) {
    auto count = json.find(field.key);
    if (count == json.end()) continue;
    if (!count->is_number_integer() || count->get<int64_t>() < 0 ||
        count->get<int64_t>() > (1 << 20)) {
      return InvalidArgumentError(where + ": '" + field.key + "' is not a count");
    }
    versions.*field.member = count->get<int>();
  }
  return versions;
}

StatusOr<TrainerVersions> AskTrainerVersions(const std::string& llm_train,
                                             std::chrono::milliseconds timeout,
                                             std::stop_token stop) {
  ASSIGN_OR_RETURN(const CommandOutput said,
                   RunCommand({llm_train, "--version", "--json"}, timeout, std::move(stop)));
  if (said.exit_code != 0) {
    return UnavailableError(llm_train + " --version --json exited with " +
                            std::to_string(said.exit_code));
  }
  return ParseTrainerVersions(Trim(said.stdout_text));
}

}  // namespace llmctl
