// Lenient reads of the JSON the store keeps (events, predictions, a node's devices), for the
// service's replies (internal to controller/'s ControllerService): a field that is missing, or of
// the wrong type (a null where an older controller stored a non-finite number), reads as 0 or "",
// so that one odd value does not fail a whole reply.
#ifndef LLMCTL_CONTROLLER_JSON_FIELDS_H_
#define LLMCTL_CONTROLLER_JSON_FIELDS_H_

#include <cmath>
#include <cstdint>
#include <limits>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

namespace llmctl::controller {

// An integer field, or a whole number written as a float (1e3); 0 for one past int64_t (a float
// of 1e19, or an unsigned 2^63, whose conversion would be undefined or wrap negative).
inline int64_t IntField(const nlohmann::json& object, std::string_view key) {
  if (!object.is_object()) return 0;
  auto it = object.find(std::string(key));
  if (it == object.end() || !it->is_number()) return 0;
  if (it->is_number_unsigned()) {
    const uint64_t value = it->get<uint64_t>();
    return value <= static_cast<uint64_t>(std::numeric_limits<int64_t>::max())
               ? static_cast<int64_t>(value)
               : 0;
  }
  if (it->is_number_integer()) return it->get<int64_t>();
  // 2^63 is exactly representable; every double below it in magnitude converts.
  const double value = it->get<double>();
  return std::fabs(value) < 0x1p63 ? static_cast<int64_t>(value) : 0;
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
