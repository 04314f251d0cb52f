#include "common/cpu_model.h"

#include <fstream>

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

}  // namespace llmctl
