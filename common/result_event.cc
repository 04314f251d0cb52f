#include "common/result_event.h"

#include <nlohmann/json.hpp>

namespace llmctl::result_event {

std::optional<Checkpoint> CheckpointOf(const nlohmann::json& result) {
  if (!result.is_object()) return std::nullopt;
  const auto checkpoint = result.find(kCheckpoint);
  if (checkpoint == result.end() || !checkpoint->is_object()) return std::nullopt;
  const auto step = checkpoint->find(kCheckpointStep);
  const auto path = checkpoint->find(kCheckpointPath);
  if (step == checkpoint->end() || !step->is_number_integer() || step->get<int64_t>() < 0 ||
      path == checkpoint->end() || !path->is_string() || path->get<std::string>().empty()) {
    return std::nullopt;
  }
  return Checkpoint{.path = path->get<std::string>(), .step = step->get<int64_t>()};
}

}  // namespace llmctl::result_event
