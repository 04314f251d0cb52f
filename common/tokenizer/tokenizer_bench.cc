// Encode throughput: tokenizer_bench TOKENIZER_JSON_OR_DIR FILE.jsonl [REPEATS]
//
// Each JSONL line is an object with "text", or an Alpaca record ("instruction", "input", "output")
// that is formatted with the Alpaca prompt; other lines are used as they are. Prints tokens/s for
// the first pass (empty word cache) and for the later passes. Not part of the default build: `cmake
// --build B --target tokenizer_bench`.
#include <chrono>
#include <cstdio>
#include <cstdlib>
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

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: %s TOKENIZER FILE.jsonl [REPEATS]\n", argv[0]);
    return 2;
  }
  const int repeats = argc > 3 ? std::atoi(argv[3]) : 10;
  llmctl::StatusOr<llmctl::Tokenizer> tokenizer = llmctl::Tokenizer::Load(argv[1]);
  if (!tokenizer.ok()) {
    std::fprintf(stderr, "%s\n", tokenizer.status().ToString().c_str());
    return 1;
  }
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
  using Clock = std::chrono::steady_clock;
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
