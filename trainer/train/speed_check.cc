#include "trainer/train/speed_check.h"

#include <ATen/Context.h>

#include <mutex>
#include <optional>
#include <string>

#include "common/speed_check_event.h"
#include "trainer/memory/counting_allocator.h"
#include "trainer/train/probe_rounds.h"

namespace llmctl::trainer {
namespace {

// The rounds' time: at about 10 ms a sample, five samples of the cell after its warm-up calls.
constexpr double kCheckSeconds = 0.05;

// While alive, `device`'s default generator is where it was when this was made.
class GeneratorStateKept {
 public:
  explicit GeneratorStateKept(torch::Device device)
      : generator_(at::globalContext().defaultGenerator(device)) {
    std::lock_guard<std::mutex> lock(generator_.mutex());
    state_ = generator_.get_state();
  }
  ~GeneratorStateKept() {
    std::lock_guard<std::mutex> lock(generator_.mutex());
    generator_.set_state(state_);
  }
  GeneratorStateKept(const GeneratorStateKept&) = delete;
  GeneratorStateKept& operator=(const GeneratorStateKept&) = delete;

 private:
  at::Generator generator_;
  torch::Tensor state_;
};

}  // namespace

StatusOr<double> MeasureSpeedCheck(torch::Device device) {
  const speed_check_event::Cell& cell = speed_check_event::CellFor(device.is_cuda());
  try {
    torch::NoGradGuard no_grad;
    std::optional<ScopedHostAllocations> host;
    if (!device.is_cuda()) host.emplace();
    double seconds = 0;
    {
      const GeneratorStateKept kept(device);
      ProbeRounds rounds(device);
      rounds.Add(
          ProjectionMatmuls(cell.tokens, cell.size,
                            torch::TensorOptions().dtype(ProbeDtype(cell.dtype)).device(device)),
          [&seconds](double median) { seconds = median; });
      rounds.Run(kCheckSeconds);
    }
    return ProjectionMatmulFlops(cell.tokens, cell.size) / seconds;
  } catch (const c10::OutOfMemoryError& e) {
    return ResourceExhaustedError(std::string("its operands did not fit: ") +
                                  e.what_without_backtrace());
  } catch (const c10::Error& e) {
    return InternalError(e.what_without_backtrace());
  }
}

}  // namespace llmctl::trainer
