// What one StreamEventsResponse may carry (the agent's StreamEvents to the controller): the agent
// sends no more, and the controller refuses a message with more, which an agent of this project
// never sends; each refused or stored item costs the controller far more than its bytes on the
// wire (an empty event is 2 bytes there and a stored refused_line of about 100).
#ifndef LLMCTL_COMMON_EVENT_STREAM_H_
#define LLMCTL_COMMON_EVENT_STREAM_H_

#include <charconv>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace llmctl::event_stream {

// Device samples in one message (a long backlog after a reconnect goes in several).
inline constexpr int kSamplesPerMessage = 1000;
// Event lines in one batch (StreamEventsRequest.batch_events), and their bytes: one more line
// (event_line::kMaxBytes) still fits the controller's 8 MiB message.
inline constexpr int kEventsPerMessage = 512;
inline constexpr int64_t kEventBytesPerMessage = int64_t{4} << 20;

// The devices an agent samples (DeviceSample.device): its host, and each CUDA device by the node's
// index. The agent names them so; the controller stores no others.
inline constexpr std::string_view kHostDevice = "cpu";
inline std::string CudaDeviceName(int64_t index) { return "cuda:" + std::to_string(index); }
// The node's index a CudaDeviceName names; none for any other text (a sign or a leading zero too).
inline std::optional<int64_t> CudaDeviceIndex(std::string_view name) {
  if (!name.starts_with("cuda:")) return std::nullopt;
  const std::string_view digits = name.substr(5);
  int64_t index = 0;
  const auto [end, error] = std::from_chars(digits.data(), digits.data() + digits.size(), index);
  if (error != std::errc() || end != digits.data() + digits.size() || digits.empty() ||
      (digits.size() > 1 && digits[0] == '0') || index < 0) {
    return std::nullopt;
  }
  return index;
}

}  // namespace llmctl::event_stream

#endif  // LLMCTL_COMMON_EVENT_STREAM_H_
