#include "controller/cli/plan.h"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>

#include "common/atomic_file.h"
#include "common/blip2_config.h"
#include "common/byte_size.h"
#include "common/estimate/gpus.h"
#include "common/estimate/memory_verdict.h"
#include "common/estimate/plan_search.h"
#include "common/experiment.h"
#include "common/foreign_json.h"
#include "common/model_config.h"
#include "common/printf.h"
#include "common/text.h"
#include "common/trial_config.h"
#include "common/trial_settings.h"
#include "controller/cli/estimate_render.h"
#include "controller/cli/estimate_trial.h"
#include "controller/cli/inputs.h"
#include "controller/cli/report_format.h"

namespace llmctl::cli {
namespace {

namespace fs = std::filesystem;
using nlohmann::ordered_json;

std::vector<std::string> SplitList(const std::string& text) {
  std::vector<std::string> items;
  size_t start = 0;
  while (start <= text.size()) {
    const size_t comma = text.find(',', start);
    const std::string item(
        Trim(text.substr(start, comma == std::string::npos ? std::string::npos : comma - start)));
    if (!item.empty()) items.push_back(item);
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return items;
}

// A comma list of a trial key's values, each checked against the key's allowed values.
StatusOr<std::vector<std::string>> ValuesOf(const std::string& flag, const std::string& key,
                                            const std::string& text) {
  std::vector<std::string> values = SplitList(text);
  if (values.empty()) return InvalidArgumentError(flag + ": expected a comma-separated list");
  TrialConfig probe;
  for (const std::string& value : values) {
    const Status valid = probe.SetFromText(key, value);
    if (!valid.ok()) return InvalidArgumentError(flag + ": " + valid.message());
  }
  return values;
}

// "45 s", "12.3 min", "3 h 05 min".
std::string Duration(double seconds) {
  if (seconds < 90) return Printf("%.0f s", seconds);
  if (seconds < 3600) return Printf("%.1f min", seconds / 60);
  const int64_t minutes = static_cast<int64_t>(std::lround(seconds / 60));
  return std::to_string(minutes / 60) + " h " + (minutes % 60 < 10 ? "0" : "") +
         std::to_string(minutes % 60) + " min";
}

struct Resolved {
  estimate::PlanRequest request;
  std::string device_text;  // "h100-94gb (NVIDIA H100 NVL (94 GB)), 93.6 GiB"
  bool cuda = false;
  bool blip2 = false;  // BLIP-2: images and captions (data.format imagefolder)
  int64_t ranks = 1;
  // The --set keys in the order given. Their values are request.base's, each parsed once there,
  // which the written file sets them to.
  std::vector<std::string> set_keys;
};

// MODEL: BLIP-2 by its preset's name (with or without hf:Salesforce/) or a directory, else the
// LLaMA family from a preset or a local directory.
Status ResolvePlanModel(const PlanOptions& o, Resolved& r) {
  if (o.model.empty()) return InvalidArgumentError("MODEL: a preset name or a model directory");
  std::string blip2_name = o.model;
  if (blip2_name.starts_with(kHubModelPrefix)) blip2_name.erase(0, kHubModelPrefix.size());
  StatusOr<std::optional<Blip2Config>> blip2 = ResolveBlip2Model(blip2_name);
  if (!blip2.ok()) return InvalidArgumentError("MODEL: " + blip2.status().message());
  if (blip2->has_value()) {
    r.request.model.shapes = **blip2;
    r.blip2 = true;
    return Status::Ok();
  }
  if (IsHubModelRef(o.model)) {
    return InvalidArgumentError(
        "MODEL: " + o.model +
        " is on the Hugging Face hub; plan needs its config.json on this machine: point MODEL "
        "at a local directory holding it (BLIP-2's published models are known by name: "
        "blip2-opt-2.7b, blip2-opt-6.7b, blip2-flan-t5-xl, blip2-flan-t5-xxl)");
  }
  StatusOr<ModelConfig> model = ResolveModel(o.model);
  if (!model.ok()) return InvalidArgumentError("MODEL: " + model.status().message());
  r.request.model.shapes = *model;
  return Status::Ok();
}

// --device and --device-memory: the device's rates and the bytes a run may allocate on it.
Status ResolvePlanDevice(const PlanOptions& o, Resolved& r) {
  std::optional<uint64_t> budget;
  if (!o.device_memory.empty()) {
    StatusOr<uint64_t> bytes = ParseByteSize(o.device_memory);
    if (!bytes.ok() || *bytes == 0) {
      return InvalidArgumentError("--device-memory: expected a size such as 80GiB, got '" +
                                  o.device_memory + "'");
    }
    budget = *bytes;
  }
  if (o.device == "cpu") {
    r.request.speed = estimate::CpuSpeed();
    r.request.device_bytes = budget.value_or(std::numeric_limits<uint64_t>::max());
    r.device_text =
        "cpu" + (budget ? ", " + FormatBytes(*budget) + " budget" : ", no memory limit");
    return Status::Ok();
  }
  std::optional<estimate::Gpu> gpu = estimate::GpuNamed(o.device);
  if (!gpu) {
    return InvalidArgumentError("--device: expected a GPU (" + KnownGpuNames() + ") or cpu, got '" +
                                o.device + "'");
  }
  r.cuda = true;
  r.request.speed = estimate::GpuSpeed(*gpu);
  // What a run can allocate and still fit (memory_verdict.h): the card less the CUDA context and
  // the caching allocator's slack, and a budget's less its slack.
  estimate::MemoryLimit limit = estimate::CudaCardLimit(gpu->memory_bytes);
  if (budget) limit = estimate::Tighter(limit, estimate::CudaBudgetLimit(*budget));
  r.request.device_bytes = limit.safe_bytes;
  r.device_text = gpu->name + " (" + gpu->model + "), " + FormatBytes(r.request.device_bytes) +
                  " of its " + FormatBytes(gpu->memory_bytes) + " usable";
  return Status::Ok();
}

// --gpus, --nodes, --seq, --global-batch and the run's length in --steps or --tokens.
Status ResolveRunShape(const PlanOptions& o, Resolved& r) {
  if (o.gpus < 1) return InvalidArgumentError("--gpus: expected 1 or more");
  if (o.nodes < 1) return InvalidArgumentError("--nodes: expected 1 or more");
  if (o.seq < 1) return InvalidArgumentError("--seq: expected the sequence length, 1 or more");
  if (o.global_batch < 1) return InvalidArgumentError("--global-batch: expected 1 or more");
  if (o.steps < 0) return InvalidArgumentError("--steps: expected 1 or more");
  if (o.tokens < 0) return InvalidArgumentError("--tokens: expected 1 or more");
  if ((o.steps > 0) == (o.tokens > 0)) {
    return InvalidArgumentError("give the run's length as one of --steps N or --tokens N");
  }
  // Each count within its trial key's bound before they are multiplied: within them the products
  // fit in 64 bits (a global batch of 2^62 sequences of 4 tokens made 0 tokens a step, and the
  // division below killed llmctl with SIGFPE).
  TrialConfig& base = r.request.base;
  for (const auto& [key, value] : std::vector<std::pair<std::string, std::string>>{
           {"data.max_seq_length", std::to_string(o.seq)},
           {"train.global_batch_size", std::to_string(o.global_batch)},
           {"devices", std::to_string(o.gpus)},
           {"nodes", std::to_string(o.nodes)}}) {
    RETURN_IF_ERROR(base.SetFromText(key, value));
  }
  r.ranks = o.gpus * o.nodes;
  const int64_t step_tokens = o.global_batch * o.seq;
  r.request.steps =
      o.steps > 0 ? o.steps : o.tokens / step_tokens + (o.tokens % step_tokens != 0 ? 1 : 0);
  RETURN_IF_ERROR(base.Set("train.max_steps", r.request.steps));
  r.request.budget_seconds = o.budget_hours * 3600;
  return Status::Ok();
}

// The settings every candidate starts from besides the run's shape (ResolveRunShape): the model,
// its data format and LoRA targets, then the user's --set.
Status SetPlanBase(const PlanOptions& o, Resolved& r) {
  TrialConfig& base = r.request.base;
  for (const auto& [key, value] : std::vector<std::pair<std::string, std::string>>{
           {"model", o.model},
           {"data.path", o.data.empty() ? "data.jsonl" : o.data},
           {"device", r.cuda ? "cuda" : "cpu"}}) {
    RETURN_IF_ERROR(base.SetFromText(key, value));
  }
  if (!o.tokenizer.empty()) RETURN_IF_ERROR(base.SetFromText("tokenizer", o.tokenizer));
  if (r.blip2) {
    RETURN_IF_ERROR(base.SetFromText("data.format", "imagefolder"));
    // LoRA's usual targets by the language model's own names: OPT's q_proj and v_proj (the
    // default), T5's q and v.
    if (std::get<Blip2Config>(r.request.model.shapes).t5() != nullptr) {
      RETURN_IF_ERROR(base.Set("peft.targets", std::vector<std::string>{"q", "v"}));
    }
  }
  // A --set is quoted at most this long: a 100,000-character value made a 200 KB message.
  constexpr size_t kMaxQuotedSetBytes = 200;
  for (const std::string& set : o.sets) {
    const std::string quoted = OnOneLine(set, kMaxQuotedSetBytes);
    const size_t eq = set.find('=');
    if (eq == std::string::npos) {
      return InvalidArgumentError("--set: expected KEY=VALUE, got '" + quoted + "'");
    }
    const std::string key = set.substr(0, eq);
    const Status applied = base.SetFromText(key, set.substr(eq + 1));
    if (!applied.ok()) return InvalidArgumentError("--set " + quoted + ": " + applied.message());
    r.set_keys.push_back(key);
  }
  return Status::Ok();
}

// What the search varies (--precisions, --optimizers, --peft, offload), and the rates and
// calibration it predicts time with.
Status SetPlanSearch(const PlanOptions& o, Resolved& r) {
  estimate::PlanSpace& space = r.request.space;
  ASSIGN_OR_RETURN(space.precisions, ValuesOf("--precisions", "precision", o.precisions));
  ASSIGN_OR_RETURN(space.optimizers, ValuesOf("--optimizers", "optimizer", o.optimizers));
  ASSIGN_OR_RETURN(space.peft_methods, ValuesOf("--peft", "peft.method", o.peft));
  space.offload = !o.no_offload;
  const estimate::ModelFamily family =
      r.blip2 ? estimate::ModelFamily::kBlip2 : estimate::ModelFamily::kLlama;
  // A plan names no target: any node of its device.
  if (o.rates) r.request.speed = o.rates(r.request.speed, {});
  r.request.calibration = o.calibrate ? o.calibrate(r.request.speed, family)
                                      : estimate::DefaultCalibration(r.request.speed, family);
  return Status::Ok();
}

// The plan's request from the command line, each part checked in the order the flags are
// documented.
StatusOr<Resolved> Resolve(const PlanOptions& o) {
  Resolved r;
  RETURN_IF_ERROR(ResolvePlanModel(o, r));
  RETURN_IF_ERROR(ResolvePlanDevice(o, r));
  RETURN_IF_ERROR(ResolveRunShape(o, r));
  RETURN_IF_ERROR(SetPlanBase(o, r));
  RETURN_IF_ERROR(SetPlanSearch(o, r));
  return r;
}

// The keys a candidate sets on top of the base, as an experiment file's trial `set:` nests them.
YAML::Node CandidateSet(const estimate::PlanCandidate& c) {
  const TrialSettings& s = c.config.settings();
  YAML::Node set;
  set["precision"] = std::string(Name(s.memory.precision));
  set["optimizer"] = std::string(Name(s.train.optimizer));
  if (s.peft.method != trial::PeftMethod::kNone) {
    set["peft"]["method"] = std::string(Name(s.peft.method));
    for (const std::string& target : s.peft.targets) set["peft"]["targets"].push_back(target);
    set["peft"]["targets"].SetStyle(YAML::EmitterStyle::Flow);
  }
  if (s.memory.activation_checkpointing) set["activation_checkpointing"] = true;
  if (s.parallel.strategy != trial::Strategy::kAuto) {
    set["strategy"] = std::string(Name(s.parallel.strategy));
  }
  if (s.memory.offload != trial::Offload::kNone) {
    set["offload"] = std::string(Name(s.memory.offload));
  }
  set["train"]["micro_batch_size"] = s.train.micro_batch_size;
  return set;
}

// `path` as the written file names it: relative to the file's directory when it is a local path.
std::string BesideFile(const std::string& path, const fs::path& file) {
  if (path.empty() || FindPreset(path) != nullptr) return path;
  // Beside or below the file: relative, so the two move together; elsewhere absolute.
  // error_code overloads: fs::absolute throws when the working directory is gone; the path is then
  // written as given.
  std::error_code error;
  const fs::path absolute = fs::absolute(path, error);
  if (error) return path;
  const fs::path relative = fs::relative(absolute, fs::absolute(file, error).parent_path(), error);
  if (error || relative.empty() || *relative.begin() == "..") return absolute.string();
  return relative.string();
}

// "a.b.c" as {"a", "b", "c"}.
std::vector<std::string> KeyParts(const std::string& key) {
  std::vector<std::string> parts;
  size_t start = 0;
  for (size_t dot; (dot = key.find('.', start)) != std::string::npos; start = dot + 1) {
    parts.push_back(key.substr(start, dot - start));
  }
  parts.push_back(key.substr(start));
  return parts;
}

// The YAML node of a trial key's JSON value: a string as a string scalar, which the emitter quotes
// where YAML would read it otherwise ('runs/a: b', '[x', 'x #y' wrote a map, threw, or lost
// ' #y' when the text went through YAML::Load), a list item by item, a number or boolean as the
// JSON writes it (the shortest text that reads back the same).
YAML::Node YamlOf(const nlohmann::json& value) {
  if (value.is_null()) return YAML::Node(YAML::NodeType::Null);
  if (value.is_string()) return YAML::Node(value.get<std::string>());
  if (value.is_array()) {
    YAML::Node list(YAML::NodeType::Sequence);
    for (const nlohmann::json& item : value) list.push_back(YamlOf(item));
    return list;
  }
  return YAML::Load(value.dump());
}

std::string ExperimentYaml(const PlanOptions& o, const Resolved& r, const estimate::Plan& plan,
                           const std::string& command) {
  const fs::path file(o.write);
  YAML::Node root;
  // A model directory's name may hold what an experiment's name may not ("My Model (v2)").
  root["name"] = NameFrom(std::string("plan-").append(fs::path(o.model).filename().string()));
  root["description"] =
      "The configurations `llmctl plan` predicts fit " + r.device_text + ", fastest first";
  root["model"] = BesideFile(o.model, file);
  if (!o.tokenizer.empty()) root["tokenizer"] = BesideFile(o.tokenizer, file);
  const ModelConfig* preset = FindPreset(o.model);
  root["init"] = !o.init.empty()                                    ? o.init
                 : preset != nullptr && !preset->hf_repo_id.empty() ? "pretrained"
                                                                    : "random";
  root["data"]["path"] = BesideFile(o.data, file);
  if (r.blip2) root["data"]["format"] = "imagefolder";
  root["data"]["max_seq_length"] = o.seq;
  root["train"]["global_batch_size"] = o.global_batch;
  root["train"]["max_steps"] = r.request.steps;
  root["device"] = r.cuda ? "cuda" : "cpu";
  if (o.gpus > 1) root["devices"] = o.gpus;
  if (o.nodes > 1) root["nodes"] = o.nodes;
  if (!o.device_memory.empty()) root["device_memory"] = o.device_memory;
  // The --set keys as the plan's base holds them: its ToJson nests every key set, these among them,
  // a string key's text as one string whatever YAML would read it as.
  const nlohmann::json base = r.request.base.ToJson();
  for (const std::string& key : r.set_keys) {
    const std::vector<std::string> parts = KeyParts(key);
    YAML::Node at = root;
    const nlohmann::json* value = &base;
    for (size_t i = 0; i + 1 < parts.size(); ++i) {
      // reset() rebinds `at`; assignment would overwrite the node it refers to.
      at.reset(at[parts[i]]);
      value = &value->at(parts[i]);
    }
    at[parts.back()] = YamlOf(value->at(parts.back()));
  }
  const size_t rows = std::min<size_t>(plan.fits.size(), static_cast<size_t>(o.top));
  for (size_t i = 0; i < rows; ++i) {
    const estimate::PlanCandidate& c = plan.fits[i];
    YAML::Node trial;
    trial["name"] = c.name;
    trial["description"] = "plan #" + std::to_string(i + 1) + ": predicted peak " +
                           FormatBytes(c.memory.peak_bytes) + ", " +
                           Grouped(c.time.tokens_per_second, 0) + " tokens/s at full sequences, " +
                           Duration(c.time.trial_seconds);
    trial["set"] = CandidateSet(c);
    trial["expect"] = "ok";
    root["trials"].push_back(trial);
  }
  YAML::Emitter out;
  out << root;
  // A run counts its real tokens, which a row's description does not: submit predicts each row
  // again at its data's drawn lengths, and that is the figure the report sets beside the run's.
  return "# Written by " + command + "\n# Every row is predicted to fit; `llmctl report` sets " +
         "each one's measured peak and tokens/s beside the prediction.\n# The descriptions' " +
         "tokens/s are at full sequences; `llmctl submit` (and `llmctl estimate` on this file) " +
         "predicts each row again at its data's lengths, in the tokens the run counts.\n" +
         out.c_str() + "\n";
}

// Which plan flag supplies what a refused input names, for the message.
std::string FlagHint(const std::string& message, const PlanOptions& o) {
  if (message.find("tokenizer") != std::string::npos) {
    return o.tokenizer.empty() ? "; --tokenizer PATH names one"
                               : "; check --tokenizer " + o.tokenizer;
  }
  if (message.find("data.path") != std::string::npos) return "; check --data " + o.data;
  return "";
}

// The written file's inputs checked as `llmctl submit` checks them (CollectInputs' walk, then
// CheckLocalInputs), so that plan never writes a file submit refuses; their bytes are hashed by
// that submit, not here.
Status CheckSubmittable(const std::string& yaml, const PlanOptions& o) {
  std::error_code error;
  const fs::path absolute = fs::absolute(o.write, error);
  if (error) return InvalidArgumentError("--write " + o.write + ": " + error.message());
  const std::string file = absolute.string();
  StatusOr<Experiment> checked =
      ParseExperiment(yaml, file, {.resolve_local_paths = true, .output_dir_in_run = true});
  StatusOr<Experiment> as_written =
      ParseExperiment(yaml, file, {.resolve_local_paths = false, .output_dir_in_run = true});
  Status refused = !checked.ok()      ? checked.status()
                   : !as_written.ok() ? as_written.status()
                                      : CheckInputPaths(*as_written, file);
  if (refused.ok()) refused = CheckLocalInputs(*checked, file);
  if (refused.ok()) return Status::Ok();
  return InvalidArgumentError("--write " + o.write +
                              ": not written, `llmctl submit` would refuse it: " +
                              refused.message() + FlagHint(refused.message(), o));
}

// `word` as a shell reads it back, on one line (OnOneLine's spaces for its controls): the comment
// CommandLine's text goes into must stay one YAML comment however MODEL is spelled, where a
// newline in it wrote a key of its own.
std::string ShownShellWord(const std::string& word) { return ShellWord(OnOneLine(word)); }

std::string CommandLine(const PlanOptions& o) {
  std::string text =
      "llmctl plan " + ShownShellWord(o.model) + " --device " + ShownShellWord(o.device);
  if (!o.device_memory.empty()) text += " --device-memory " + ShownShellWord(o.device_memory);
  if (o.gpus > 1) text += " --gpus " + std::to_string(o.gpus);
  if (o.nodes > 1) text += " --nodes " + std::to_string(o.nodes);
  text += " --seq " + std::to_string(o.seq) + " --global-batch " + std::to_string(o.global_batch);
  text +=
      o.steps > 0 ? " --steps " + std::to_string(o.steps) : " --tokens " + std::to_string(o.tokens);
  return text;
}

double GpuHours(const estimate::PlanCandidate& c, int64_t ranks) {
  return c.time.trial_seconds * static_cast<double>(ranks) / 3600;
}

std::string RenderTable(const PlanOptions& o, const Resolved& r, const estimate::Plan& plan) {
  std::vector<std::vector<std::string>> rows = {
      {"#", "configuration", "micro x accum", "peak", "of device", "tokens/s", "time"}};
  if (r.cuda) rows[0].push_back("GPU-hours");
  if (o.su_per_node_hour > 0) rows[0].push_back("SU");
  const size_t shown = std::min<size_t>(plan.fits.size(), static_cast<size_t>(o.top));
  for (size_t i = 0; i < shown; ++i) {
    const estimate::PlanCandidate& c = plan.fits[i];
    const int64_t micro = c.config.settings().train.micro_batch_size;
    std::vector<std::string> row = {
        std::to_string(i + 1),
        c.name,
        std::to_string(micro) + " x " + std::to_string(o.global_batch / (micro * r.ranks)),
        FormatBytes(c.memory.peak_bytes),
        r.request.device_bytes == std::numeric_limits<uint64_t>::max()
            ? std::string(kNone)
            : Printf("%.0f%%", 100.0 * static_cast<double>(c.memory.peak_bytes) /
                                   static_cast<double>(r.request.device_bytes)),
        Grouped(c.time.tokens_per_second, 0),
        Duration(c.time.trial_seconds)};
    if (r.cuda) row.push_back(Printf("%.2f", GpuHours(c, r.ranks)));
    if (o.su_per_node_hour > 0) {
      row.push_back(Printf(
          "%.1f", c.time.trial_seconds / 3600 * static_cast<double>(o.nodes) * o.su_per_node_hour));
    }
    rows.push_back(row);
  }
  std::string text = "plan for " + OnOneLine(o.model) + " on " + std::to_string(r.ranks) + " x " +
                     r.device_text + ": " + CountOf(o.global_batch, "sequence", "sequences") +
                     " of " + CountOf(o.seq, "token", "tokens") + " a step, " +
                     CountOf(r.request.steps, "step", "steps") + "\n";
  if (plan.fits.empty()) {
    text += "nothing fits\n";
  } else {
    text += FormatColumns(rows, /*first_right_aligned=*/2);
    if (plan.fits.size() > shown) {
      text += std::to_string(plan.fits.size() - shown) + " more fit (--top N shows them)\n";
    }
  }
  text += "searched " + std::to_string(plan.searched) + " configurations; " +
          std::to_string(plan.fits.size()) + " fit, " + std::to_string(plan.dropped.size()) +
          " dropped:\n";
  // Grouped by reason: most configurations fall for the same few.
  std::vector<std::pair<std::string, std::vector<std::string>>> reasons;
  for (const estimate::PlanDrop& d : plan.dropped) {
    auto group = std::find_if(reasons.begin(), reasons.end(),
                              [&](const auto& r) { return r.first == d.reason; });
    const std::string entry = d.name + (d.detail.empty() ? "" : " (" + d.detail + ")");
    if (group == reasons.end()) {
      reasons.push_back({d.reason, {entry}});
    } else {
      group->second.push_back(entry);
    }
  }
  for (const auto& [reason, names] : reasons) {
    text += "  " + reason + ": ";
    for (size_t i = 0; i < names.size(); ++i) text += (i > 0 ? ", " : "") + names[i];
    text += "\n";
  }
  text += "time: predicted (" + r.request.calibration.source + "; at " +
          RatesText(r.request.speed.rates) +
          "); each configuration at the largest micro-batch that fits and divides the global "
          "batch; full sequences assumed\n";
  if (r.cuda) text += "usable: " + estimate::CudaLimitRule() + "\n";
  return text;
}

std::string RenderJson(const PlanOptions& o, const Resolved& r, const estimate::Plan& plan) {
  ordered_json out = {{"model", o.model},
                      {"device", r.device_text},
                      {"device_memory_bytes", r.request.device_bytes},
                      {"ranks", r.ranks},
                      {"seq", o.seq},
                      {"global_batch", o.global_batch},
                      {"steps", r.request.steps},
                      {"calibration", r.request.calibration.source},
                      {"searched", plan.searched},
                      {"fits", ordered_json::array()},
                      {"dropped", ordered_json::array()}};
  for (size_t i = 0; i < plan.fits.size(); ++i) {
    const estimate::PlanCandidate& c = plan.fits[i];
    const TrialSettings& s = c.config.settings();
    ordered_json row = {{"rank", i + 1},
                        {"name", c.name},
                        {"precision", Name(s.memory.precision)},
                        {"optimizer", Name(s.train.optimizer)},
                        {"peft", Name(s.peft.method)},
                        {"activation_checkpointing", s.memory.activation_checkpointing},
                        {"strategy", Name(s.parallel.strategy)},
                        {"offload", Name(s.memory.offload)},
                        {"micro_batch_size", s.train.micro_batch_size},
                        {"peak_bytes", c.memory.peak_bytes},
                        {"step_seconds", c.time.step_seconds},
                        {"tokens_per_second", c.time.tokens_per_second},
                        {"trial_seconds", c.time.trial_seconds},
                        {"gpu_hours", GpuHours(c, r.ranks)}};
    if (o.su_per_node_hour > 0) {
      row["service_units"] =
          c.time.trial_seconds / 3600 * static_cast<double>(o.nodes) * o.su_per_node_hour;
    }
    out["fits"].push_back(row);
  }
  for (const estimate::PlanDrop& d : plan.dropped) {
    out["dropped"].push_back({{"name", d.name}, {"reason", d.reason}, {"detail", d.detail}});
  }
  // Only with a probe: without one the JSON is as it was (the data sheets' rates).
  if (!r.request.speed.rates.empty()) out["rates"] = r.request.speed.rates;
  // Lossy: it holds the paths and names the user typed, which need not be UTF-8.
  return DumpForTerminal(out, 2) + "\n";
}

}  // namespace

StatusOr<std::string> PlanRun(const PlanOptions& options) {
  if (options.format != "table" && options.format != "json") {
    return InvalidArgumentError("--format: expected table or json, got '" + options.format + "'");
  }
  if (options.top < 1) return InvalidArgumentError("--top: expected 1 or more");
  if (!options.write.empty() && options.data.empty()) {
    return InvalidArgumentError("--write needs --data PATH: the experiment file's training data");
  }
  if (options.budget_hours < 0 || options.su_per_node_hour < 0) {
    return InvalidArgumentError("--budget-hours and --su-per-node-hour take positive numbers");
  }
  ASSIGN_OR_RETURN(const Resolved resolved, Resolve(options));
  StatusOr<estimate::Plan> plan = estimate::SearchPlans(resolved.request);
  if (!plan.ok()) return InvalidArgumentError(plan.status().message());
  if (!options.write.empty()) {
    if (plan->fits.empty()) {
      return FailedPreconditionError("--write " + options.write +
                                     ": nothing fits, so there is nothing to write");
    }
    const std::string yaml = ExperimentYaml(options, resolved, *plan, CommandLine(options));
    // What is written must be what `llmctl submit` runs: checked as it will be, before it lands.
    RETURN_IF_ERROR(CheckSubmittable(yaml, options));
    // What an earlier --write to the same file left when Ctrl-C or kill -9 ended it mid-write.
    (void)RemoveAtomicWriteLeftoversOfEndedWriters(options.write);
    const Status written = WriteFileAtomically(
        options.write, [&](int fd) { return WriteAll(fd, yaml.data(), yaml.size()); });
    // The local file's error is this machine's (a full disk, a missing directory), not bad input.
    if (!written.ok()) {
      return FailedPreconditionError("--write " + options.write + ": " + written.message());
    }
  }
  return options.format == "json" ? RenderJson(options, resolved, *plan)
                                  : RenderTable(options, resolved, *plan);
}

}  // namespace llmctl::cli
