// Load cost and encode throughput: tokenizer_bench TOKENIZER_JSON_OR_DIR [FILE.jsonl [REPEATS]]
//
// Prints the load's wall time and the process's memory after it (resident set before, at its peak
// and after, from /proc/self/status, and the heap still in use: the tokenizer's tables), also when
// the load fails (a hostile file); make_load_bench_files.py writes large and hostile files for it.
// With FILE.jsonl: each line is an object with "text", or an Alpaca record ("instruction",
// "input", "output") that is formatted with the Alpaca prompt; other lines are used as they are.
// Prints tokens/s for the first pass (empty word cache) and for the later passes. Not part of the
// default build: `cmake --build B --target tokenizer_bench`.
#include <malloc.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "common/tokenizer/tokenizer.h"

namespace {

std::string ToText(const std::string& line) {
  const nlohmann::json j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object()) return line;
  if (j.contains("text") && j["text"].is_string()) return j["text"];
  const auto field = [&](const char* key) {
    return j.contains(key) && j[key].is_string() ? j[key].get<std::string>() : std::string();
  };
  std::string text =
      "Below is an instruction that describes a task. Write a response that appropriately "
      "completes "
      "the request.\n\n### Instruction:\n" +
      field("instruction") + "\n\n";
  if (!field("input").empty()) text += "### Input:\n" + field("input") + "\n\n";
  return text + "### Response:\n" + field("output");
}

// A "VmHWM:" or "VmRSS:" line of /proc/self/status, in MiB; -1 when unreadable.
double StatusMiB(const std::string& field) {
  std::ifstream in("/proc/self/status");
  for (std::string line; std::getline(in, line);) {
    if (line.starts_with(field)) return std::atof(line.c_str() + field.size()) / 1024.0;
  }
  return -1;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s TOKENIZER [FILE.jsonl [REPEATS]]\n", argv[0]);
    return 2;
  }
  using Clock = std::chrono::steady_clock;
  const double rss_before = StatusMiB("VmRSS:");
  const auto load_start = Clock::now();
  llmctl::StatusOr<llmctl::Tokenizer> tokenizer = llmctl::Tokenizer::Load(argv[1]);
  const double load_seconds = std::chrono::duration<double>(Clock::now() - load_start).count();
  std::error_code error;
  std::filesystem::path file = argv[1];
  if (std::filesystem::is_directory(file, error)) file /= "tokenizer.json";
  const auto file_bytes = std::filesystem::file_size(file, error);
  const struct mallinfo2 heap = ::mallinfo2();
  std::printf(
      "load: %.1f ms, file %.1f MiB, RSS %.1f MiB before, peak %.1f MiB, %.1f MiB after; heap in "
      "use after %.1f MiB\n",
      load_seconds * 1e3, error ? -1.0 : file_bytes / 1048576.0, rss_before, StatusMiB("VmHWM:"),
      StatusMiB("VmRSS:"), (heap.uordblks + heap.hblkhd) / 1048576.0);
  if (!tokenizer.ok()) {
    std::fprintf(stderr, "%s\n", tokenizer.status().ToString().c_str());
    return 1;
  }
  if (argc < 3) return 0;
  const int repeats = argc > 3 ? std::atoi(argv[3]) : 10;
  std::vector<std::string> texts;
  size_t bytes = 0;
  std::ifstream in(argv[2]);
  for (std::string line; std::getline(in, line);) {
    if (line.empty()) continue;
    texts.push_back(ToText(line));
    bytes += texts.back().size();
  }
  if (texts.empty()) {
    std::fprintf(stderr, "%s: no texts\n", argv[2]);
    return 1;
  }
  size_t tokens = 0;
  double first_pass = 0;
  double later_passes = 0;
  for (int r = 0; r < 1 + repeats; ++r) {
    const auto start = Clock::now();
    size_t pass_tokens = 0;
    for (const std::string& text : texts) {
      llmctl::StatusOr<std::vector<int32_t>> ids = tokenizer->Encode(text, true);
      if (!ids.ok()) {
        std::fprintf(stderr, "%s\n", ids.status().ToString().c_str());
        return 1;
      }
      pass_tokens += ids->size();
    }
    const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
    (r == 0 ? first_pass : later_passes) += seconds;
    tokens = pass_tokens;
  }
  std::printf("%zu texts, %zu bytes, %zu tokens per pass\n", texts.size(), bytes, tokens);
  std::printf("first pass (cold cache): %.1f ms, %.0f tokens/s\n", first_pass * 1e3,
              tokens / first_pass);
  if (repeats > 0) {
    const double per_pass = later_passes / repeats;
    std::printf("later passes (warm):     %.1f ms, %.0f tokens/s, %.1f MB/s\n", per_pass * 1e3,
                tokens / per_pass, bytes / per_pass / 1e6);
  }
  return 0;
}
