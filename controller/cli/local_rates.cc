#include "controller/cli/local_rates.h"

#include <spawn.h>
#include <sys/wait.h>

#include <cerrno>
#include <cstring>
#include <nlohmann/json.hpp>
#include <vector>

#include "common/cpu_model.h"
#include "common/files.h"
#include "controller/cli/daemons.h"

extern char** environ;

namespace llmctl::cli {
namespace {

namespace fs = std::filesystem;

constexpr char kProbeFile[] = "probe.json";
// A probe's JSON is a few kilobytes; anything much larger is not one.
constexpr size_t kMaxProbeBytes = 1 << 20;

// Runs `llm-train --probe --probe-output PATH` and waits for it; its messages go to the
// terminal. Internal naming the exit when it does not end well.
Status RunProbe(const fs::path& llm_train, const fs::path& path) {
  std::vector<std::string> args = {llm_train.string(), "--probe", "--probe-output", path.string()};
  std::vector<char*> argv;
  for (std::string& arg : args) argv.push_back(arg.data());
  argv.push_back(nullptr);
  pid_t pid = 0;
  const int spawned = ::posix_spawn(&pid, argv[0], nullptr, nullptr, argv.data(), environ);
  if (spawned != 0) {
    return InternalError(llm_train.string() + ": cannot start: " + std::strerror(spawned));
  }
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0) {
    if (errno != EINTR) return InternalError(std::string("waitpid: ") + std::strerror(errno));
  }
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    return InternalError(llm_train.string() + " --probe ended with " +
                         (WIFEXITED(status) ? "exit code " + std::to_string(WEXITSTATUS(status))
                                            : "a signal"));
  }
  return Status::Ok();
}

}  // namespace

StatusOr<estimate::RateProbe> ReadRateProbe(const fs::path& path) {
  StatusOr<std::string> text = ReadFileToString(path.string(), kMaxProbeBytes);
  if (!text.ok()) return InvalidArgumentError(text.status().message());
  const nlohmann::json json = nlohmann::json::parse(*text, nullptr, /*allow_exceptions=*/false);
  if (json.is_discarded()) return InvalidArgumentError(path.string() + ": not JSON");
  StatusOr<estimate::RateProbe> probe = estimate::RateProbe::FromJson(json);
  if (!probe.ok()) return InvalidArgumentError(path.string() + ": " + probe.status().message());
  return probe;
}

LocalRates LocalRates::FromProbe(const estimate::RateProbe& probe, const std::string& where) {
  LocalRates rates;
  rates.probe_ = probe;
  rates.source_ = "this machine's probe (" + where + "): " + probe.Summary();
  return rates;
}

LocalRates LocalRates::Load(const EnvLookup& env, const fs::path& self, std::ostream& err) {
  if (const std::optional<std::string> setting = env(kRateProbeVariable); setting.has_value()) {
    if (*setting == "off") return LocalRates();
    err << "note: " << kRateProbeVariable << "='" << *setting
        << "' is not 'off' (the only value it takes); this machine's probe is used\n";
  }
  StatusOr<fs::path> dir = EmbeddedDataDir(env);
  if (!dir.ok()) return LocalRates();  // the calibration's note says why
  const fs::path path = *dir / kProbeFile;
  if (fs::exists(path)) {
    StatusOr<estimate::RateProbe> probe = ReadRateProbe(path);
    if (probe.ok() && probe->device_name == CpuModelName()) return FromProbe(*probe, path.string());
    err << "note: measuring this machine's rates again: "
        << (probe.ok() ? path.string() + " was measured on " + probe->device_name
                       : probe.status().message())
        << "\n";
  }
  StatusOr<DaemonBinaries> binaries = LocateDaemonBinaries(self, env);
  if (!binaries.ok()) {
    err << "note: the time is at the data sheets' rates: this machine's are not measured ("
        << binaries.status().message() << ")\n";
    return LocalRates();
  }
  err << "measuring this machine's rates once (llm-train --probe, about 10 s) into " << path.string()
      << "; delete it to measure again\n"
      << std::flush;
  // The data directory is private, as the daemons make it.
  std::error_code error;
  if (fs::create_directories(*dir, error)) fs::permissions(*dir, fs::perms::owner_all, error);
  const Status made = error ? FailedPreconditionError(dir->string() + ": cannot create: " +
                                                      error.message())
                            : RunProbe(binaries->llm_train, path);
  StatusOr<estimate::RateProbe> probe = made.ok() ? ReadRateProbe(path)
                                                  : StatusOr<estimate::RateProbe>(made);
  if (!probe.ok()) {
    err << "note: the time is at the data sheets' rates: " << probe.status().message() << "\n";
    return LocalRates();
  }
  return FromProbe(*probe, path.string());
}

LocalRates LocalRates::LoadOnFirstUse(EnvLookup env, fs::path self, std::ostream& err) {
  LocalRates rates;
  rates.deferred_ = Deferred{std::move(env), std::move(self), &err};
  return rates;
}

estimate::DeviceSpeed LocalRates::For(const estimate::DeviceSpeed& sheet) const {
  if (sheet.name != "cpu") return sheet;
  if (deferred_.has_value()) {
    LocalRates loaded = Load(deferred_->env, deferred_->self, *deferred_->err);
    deferred_.reset();
    probe_ = std::move(loaded.probe_);
    source_ = std::move(loaded.source_);
  }
  if (!probe_ || probe_->device != "cpu") return sheet;
  return estimate::ProbedSpeed(sheet, *probe_, source_);
}

}  // namespace llmctl::cli
