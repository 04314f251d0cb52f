// Lenient reads of the JSON the store keeps (events, predictions, a node's devices), for the
// service's replies (internal to controller/'s ControllerService): a field that is missing, or of
// the wrong type (a null where an older controller stored a non-finite number), reads as 0 or "",
// so that one odd value does not fail a whole reply.
#ifndef LLMCTL_CONTROLLER_JSON_FIELDS_H_
#define LLMCTL_CONTROLLER_JSON_FIELDS_H_

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

namespace llmctl::controller {

inline int64_t IntField(const nlohmann::json& object, std::string_view key) {
  if (!object.is_object()) return 0;
  auto it = object.find(std::string(key));
  return it != object.end() && it->is_number() ? it->get<int64_t>() : 0;
}

inline double NumberField(const nlohmann::json& object, std::string_view key) {
  if (!object.is_object()) return 0;
  auto it = object.find(std::string(key));
  return it != object.end() && it->is_number() ? it->get<double>() : 0;
}

inline std::string StringField(const nlohmann::json& object, std::string_view key) {
  if (!object.is_object()) return "";
  auto it = object.find(std::string(key));
  return it != object.end() && it->is_string() ? it->get<std::string>() : "";
}

}  // namespace llmctl::controller

#endif  // LLMCTL_CONTROLLER_JSON_FIELDS_H_
