// Reading the OpenStack services' JSON answers, whose members may be missing or null.
#ifndef LLMCTL_CONTROLLER_OPENSTACK_JSON_FIELDS_H_
#define LLMCTL_CONTROLLER_OPENSTACK_JSON_FIELDS_H_

#include <nlohmann/json.hpp>
#include <string>
#include <utility>

namespace llmctl::openstack {

// `object[key]` when `object` is an object whose `key` is a string; "" otherwise.
inline std::string StringField(const nlohmann::json& object, const char* key) {
  return object.is_object() && object.contains(key) && object[key].is_string()
             ? object[key].get<std::string>()
             : std::string();
}

// `object[key]` when `object` is an object whose `key` is an integer within an int; 0 otherwise
// (absent, another type, or past an int, which would wrap).
inline int IntField(const nlohmann::json& object, const char* key) {
  if (!object.is_object() || !object.contains(key) || !object[key].is_number_integer()) return 0;
  const nlohmann::json& number = object[key];
  return number.is_number_unsigned()
             ? (std::in_range<int>(number.get<uint64_t>()) ? number.get<int>() : 0)
             : (std::in_range<int>(number.get<int64_t>()) ? number.get<int>() : 0);
}

}  // namespace llmctl::openstack

#endif  // LLMCTL_CONTROLLER_OPENSTACK_JSON_FIELDS_H_
