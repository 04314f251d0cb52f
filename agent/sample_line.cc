#include "agent/sample_line.h"

#include <cmath>
#include <nlohmann/json.hpp>
#include <optional>

#include "common/foreign_json.h"
#include "common/text.h"

namespace llmctl::agent {
namespace {

using json = nlohmann::json;

void PutOptional(json& line, const char* key, const std::optional<double>& value) {
  if (value) line[key] = *value;
}

// nullopt when absent; false when present and not a finite number.
bool GetOptional(const json& line, const char* key, std::optional<double>& out) {
  const auto it = line.find(key);
  if (it == line.end()) return true;
  if (!it->is_number() || !std::isfinite(it->get<double>())) return false;
  out = it->get<double>();
  return true;
}

}  // namespace

std::string FormatSampleLine(const TimedReading& timed) {
  const DeviceReading& reading = timed.reading;
  json line = {{"unix_ms", timed.unix_ms}, {"device", reading.device}};
  PutOptional(line, "utilization_percent", reading.utilization_percent);
  line["memory_used_bytes"] = reading.memory_used_bytes;
  line["memory_total_bytes"] = reading.memory_total_bytes;
  PutOptional(line, "power_watts", reading.power_watts);
  PutOptional(line, "temperature_celsius", reading.temperature_celsius);
  return line.dump();
}

StatusOr<TimedReading> ParseSampleLine(std::string_view text) {
  const json line = ParseForeignJson(text);
  const auto bad = [&](const std::string& why) {
    return InvalidArgumentError("device sample line " + OnOneLine(text, 200) + ": " + why);
  };
  if (!line.is_object()) return bad("not a JSON object");
  TimedReading timed;
  DeviceReading& reading = timed.reading;
  const auto integer = [&](const char* key, int64_t& out) {
    const auto it = line.find(key);
    if (it == line.end() || !it->is_number_integer() || it->get<int64_t>() < 0) return false;
    out = it->get<int64_t>();
    return true;
  };
  if (!integer("unix_ms", timed.unix_ms)) return bad("no unix_ms");
  if (!line.value("device", json()).is_string() || line["device"].get<std::string>().empty()) {
    return bad("no device");
  }
  reading.device = line["device"].get<std::string>();
  if (!integer("memory_used_bytes", reading.memory_used_bytes) ||
      !integer("memory_total_bytes", reading.memory_total_bytes)) {
    return bad("no memory figures");
  }
  if (!GetOptional(line, "utilization_percent", reading.utilization_percent) ||
      !GetOptional(line, "power_watts", reading.power_watts) ||
      !GetOptional(line, "temperature_celsius", reading.temperature_celsius)) {
    return bad("a figure is not a number");
  }
  return timed;
}

}  // namespace llmctl::agent
