#include "controller/device_samples_proto.h"

namespace llmctl::controller {

std::vector<store::NewDeviceSample> FromProto(const v1::DeviceSamples& samples) {
  std::vector<store::NewDeviceSample> rows;
  rows.reserve(samples.samples_size());
  for (const v1::DeviceSample& sample : samples.samples()) {
    store::NewDeviceSample row;
    row.seq = sample.seq();
    row.sample.device = sample.device();
    // Past the year 9999 a Time wraps (to a valid-looking one): read as none, which is refused.
    row.sample.time = sample.unix_ms() > 0 && sample.unix_ms() <= store::kMaxUnixMillis
                          ? store::Time(std::chrono::milliseconds(sample.unix_ms()))
                          : store::Time();
    if (sample.has_utilization_percent()) {
      row.sample.utilization_percent = sample.utilization_percent();
    }
    row.sample.memory_used_bytes = sample.memory_used_bytes();
    row.sample.memory_total_bytes = sample.memory_total_bytes();
    if (sample.has_power_watts()) row.sample.power_watts = sample.power_watts();
    if (sample.has_temperature_celsius()) {
      row.sample.temperature_celsius = sample.temperature_celsius();
    }
    rows.push_back(std::move(row));
  }
  return rows;
}

void ToProto(const store::DeviceSample& sample, v1::DeviceSample* out) {
  out->set_unix_ms(
      std::chrono::duration_cast<std::chrono::milliseconds>(sample.time.time_since_epoch())
          .count());
  out->set_device(sample.device);
  out->set_node_rank(static_cast<int32_t>(sample.node_rank));
  if (sample.utilization_percent) out->set_utilization_percent(*sample.utilization_percent);
  out->set_memory_used_bytes(sample.memory_used_bytes);
  out->set_memory_total_bytes(sample.memory_total_bytes);
  if (sample.power_watts) out->set_power_watts(*sample.power_watts);
  if (sample.temperature_celsius) out->set_temperature_celsius(*sample.temperature_celsius);
}

}  // namespace llmctl::controller
