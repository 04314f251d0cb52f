// Device samples between the wire and the store: what the agents stream (StreamEvents'
// DeviceSamples items) becomes the store's rows, and the store's newest rows become Watch's
// TrialStatus.devices.
#ifndef LLMCTL_CONTROLLER_DEVICE_SAMPLES_PROTO_H_
#define LLMCTL_CONTROLLER_DEVICE_SAMPLES_PROTO_H_

#include <vector>

#include "controller/store/records.h"
#include "llmctl/v1/agent.pb.h"

namespace llmctl::controller {

// The readings as the store takes them; the store checks them (AppendDeviceSamples).
std::vector<store::NewDeviceSample> FromProto(const v1::DeviceSamples& samples);

// A stored row as Watch sends it (seq 0).
void ToProto(const store::DeviceSample& sample, v1::DeviceSample* out);

}  // namespace llmctl::controller

#endif  // LLMCTL_CONTROLLER_DEVICE_SAMPLES_PROTO_H_
