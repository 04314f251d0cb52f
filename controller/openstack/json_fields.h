// Reading the OpenStack services' JSON answers, whose members may be missing or null.
#ifndef LLMCTL_CONTROLLER_OPENSTACK_JSON_FIELDS_H_
#define LLMCTL_CONTROLLER_OPENSTACK_JSON_FIELDS_H_

#include <algorithm>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <utility>

#include "common/status.h"
#include "common/text.h"

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

// `object[key]`, an id the cloud gave `what` ("Nova server"), when it is a string that names one
// resource in the URLs llmctl builds from it ("/servers/" + id); else InternalError naming `what`
// and `key`. Refused: absent, null or not a string; empty ("/servers/" is the list of them all);
// "." or ".." (resolved to another path); holding '/', '?', '#', '%' or '\\' (a separator, a
// query, a fragment, an escape) or a control character. The services make UUIDs (Nova's flavor ids
// may also be letters, digits, '.', '_', '-' and spaces), so no id they make is refused.
inline StatusOr<std::string> IdField(const nlohmann::json& object, const char* key,
                                     std::string_view what) {
  const auto refused = [&](std::string_view problem) {
    return InternalError(std::string(what).append("'s '").append(key).append("' ").append(problem));
  };
  if (!object.is_object() || !object.contains(key) || object[key].is_null()) {
    return refused("is missing");
  }
  if (!object[key].is_string()) {
    return refused(std::string("is not a string but ").append(object[key].type_name()));
  }
  std::string id = object[key].get<std::string>();
  if (id.empty()) return refused("is empty");
  const size_t unsafe = id.find_first_of("/?#%\\");
  const bool control = std::any_of(id.begin(), id.end(), [](char c) {
    return static_cast<unsigned char>(c) < 0x20 || c == 0x7f;
  });
  if (id == "." || id == ".." || unsafe != std::string::npos || control) {
    return refused(std::string("'")
                       .append(OnOneLine(id, 80))
                       .append("' cannot be part of a URL path (it holds '/', '?', '#', '%', '\\' "
                               "or a control character, or is '.' or '..')"));
  }
  return id;
}

}  // namespace llmctl::openstack

#endif  // LLMCTL_CONTROLLER_OPENSTACK_JSON_FIELDS_H_
