#include "common/cpu_model.h"

#include <sched.h>

#include <algorithm>
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

// Whether MKL may use fewer threads than asked (MKL_DYNAMIC, true unless "false", "no" or "0" in
// any case).
bool MklDynamic() {
  const char* value = std::getenv("MKL_DYNAMIC");
  return value == nullptr || !(EqualsIgnoreCase(value, "false") || EqualsIgnoreCase(value, "no") ||
                               std::string_view(value) == "0");
}

// The value of a "key : value" line of /proc/cpuinfo.
std::string_view CpuinfoValue(std::string_view line) {
  const size_t colon = line.find(':');
  return colon == std::string_view::npos ? std::string_view() : Trim(line.substr(colon + 1));
}

}  // namespace

int LibTorchDefaultThreads() {
  // The physical cores, of the machine and of the processors this process may run on:
  // /proc/cpuinfo's distinct (physical id, core id) pairs, each processor's pair after its
  // "processor" line.
  cpu_set_t allowed;
  CPU_ZERO(&allowed);
  const bool affinity = ::sched_getaffinity(0, sizeof allowed, &allowed) == 0;
  std::set<std::pair<std::string, std::string>> cores;
  std::set<std::pair<std::string, std::string>> allowed_cores;
  std::ifstream in("/proc/cpuinfo");
  int processor = -1;
  std::string package;
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("processor", 0) == 0)
      processor = std::atoi(std::string(CpuinfoValue(line)).c_str());
    if (line.rfind("physical id", 0) == 0) package = std::string(CpuinfoValue(line));
    if (line.rfind("core id", 0) == 0) {
      const std::pair<std::string, std::string> core(package, std::string(CpuinfoValue(line)));
      cores.insert(core);
      if (!affinity ||
          (processor >= 0 && processor < CPU_SETSIZE && CPU_ISSET(processor, &allowed))) {
        allowed_cores.insert(core);
      }
    }
  }
  const unsigned processors = std::thread::hardware_concurrency();
  const int machine_cores =
      !cores.empty() ? static_cast<int>(cores.size()) : std::max(1, static_cast<int>(processors));
  // MKL's count, which LibTorch's OpenMP pool starts with: MKL_NUM_THREADS, else OMP_NUM_THREADS,
  // no more than the machine's physical cores while MKL_DYNAMIC lets MKL lower it (its default);
  // without either, the physical cores this process may run on.
  for (const char* name : {"MKL_NUM_THREADS", "OMP_NUM_THREADS"}) {
    if (const int threads = ThreadsFromEnvironment(name); threads > 0) {
      return MklDynamic() ? std::min(threads, machine_cores) : threads;
    }
  }
  if (!allowed_cores.empty()) return static_cast<int>(allowed_cores.size());
  if (affinity) return std::max(1, CPU_COUNT(&allowed));
  return machine_cores;
}

}  // namespace llmctl
