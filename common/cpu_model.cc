#include "common/cpu_model.h"

#include <cstdlib>
#include <fstream>
#include <set>
#include <string_view>
#include <thread>
#include <utility>

#include "common/text.h"

namespace llmctl {

std::string CpuModelName() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("model name", 0) == 0) {
      const size_t colon = line.find(':');
      if (colon != std::string::npos) return std::string(Trim(line.substr(colon + 1)));
    }
  }
  return "cpu";
}

namespace {

// A positive thread count from environment variable `name`, else 0 (unset or not one).
int ThreadsFromEnvironment(const char* name) {
  const char* text = std::getenv(name);
  if (text == nullptr) return 0;
  char* end = nullptr;
  const long value = std::strtol(text, &end, 10);
  return end != text && *end == '\0' && value > 0 && value <= 1 << 20 ? static_cast<int>(value) : 0;
}

// The value of a "key : value" line of /proc/cpuinfo.
std::string_view CpuinfoValue(std::string_view line) {
  const size_t colon = line.find(':');
  return colon == std::string_view::npos ? std::string_view() : Trim(line.substr(colon + 1));
}

}  // namespace

int LibTorchDefaultThreads() {
  for (const char* name : {"OMP_NUM_THREADS", "MKL_NUM_THREADS"}) {
    if (const int threads = ThreadsFromEnvironment(name); threads > 0) return threads;
  }
  std::ifstream in("/proc/cpuinfo");
  std::set<std::pair<std::string, std::string>> cores;  // (physical id, core id)
  std::string package;
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("physical id", 0) == 0) package = std::string(CpuinfoValue(line));
    if (line.rfind("core id", 0) == 0) cores.emplace(package, std::string(CpuinfoValue(line)));
  }
  if (!cores.empty()) return static_cast<int>(cores.size());
  const unsigned processors = std::thread::hardware_concurrency();
  return processors > 0 ? static_cast<int>(processors) : 1;
}

}  // namespace llmctl
