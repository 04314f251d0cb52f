#include "common/result_event.h"

#include <limits>
#include <nlohmann/json.hpp>

#include "common/text.h"

namespace llmctl::result_event {

std::optional<Checkpoint> CheckpointOf(const nlohmann::json& result) {
  if (!result.is_object()) return std::nullopt;
  const auto checkpoint = result.find(kCheckpoint);
  if (checkpoint == result.end() || !checkpoint->is_object()) return std::nullopt;
  const auto step = checkpoint->find(kCheckpointStep);
  const auto path = checkpoint->find(kCheckpointPath);
  // Callers count the step after it (step + 1): INT64_MAX is no step any run reached.
  if (step == checkpoint->end() || !step->is_number_integer() || step->get<int64_t>() < 0 ||
      step->get<int64_t>() == std::numeric_limits<int64_t>::max() || path == checkpoint->end() ||
      !path->is_string() || path->get<std::string>().empty()) {
    return std::nullopt;
  }
  return Checkpoint{.path = path->get<std::string>(), .step = step->get<int64_t>()};
}

std::string ErrorOf(const nlohmann::json& result) {
  if (!result.is_object()) return "";
  const auto error = result.find(kError);
  if (error == result.end() || !error->is_string()) return "";
  return OnOneLine(error->get_ref<const std::string&>(), kQuotedLineBytes);
}

}  // namespace llmctl::result_event
