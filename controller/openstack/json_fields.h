// Reading the OpenStack services' JSON answers, whose members may be missing or null.
#ifndef LLMCTL_CONTROLLER_OPENSTACK_JSON_FIELDS_H_
#define LLMCTL_CONTROLLER_OPENSTACK_JSON_FIELDS_H_

#include <nlohmann/json.hpp>
#include <string>

namespace llmctl::openstack {

// `object[key]` when `object` is an object whose `key` is a string; "" otherwise.
inline std::string StringField(const nlohmann::json& object, const char* key) {
  return object.is_object() && object.contains(key) && object[key].is_string()
             ? object[key].get<std::string>()
             : std::string();
}

}  // namespace llmctl::openstack

#endif  // LLMCTL_CONTROLLER_OPENSTACK_JSON_FIELDS_H_
