#include "trainer/train/versions.h"

#include <ATen/Parallel.h>
#include <ATen/Version.h>
#include <torch/cuda.h>
#include <torch/version.h>

#include <string>

#include "common/cpu_matmul.h"
#include "common/cuda_version.h"
#include "common/nvml/gpu_probe.h"
#include "common/version.h"

#ifdef LLMCTL_HAVE_CUDA
#include <ATen/detail/CUDAHooksInterface.h>
#include <cuda_runtime_api.h>
#endif

namespace llmctl::trainer {

TrainerVersions ProbeTrainerVersions() {
  TrainerVersions versions;
  versions.llmctl = std::string(kVersion);
  versions.libtorch = TORCH_VERSION;
  versions.cuda_devices = static_cast<int>(torch::cuda::device_count());
  versions.cpu_threads = at::get_num_threads();
  versions.aten_cpu_capability = at::get_cpu_capability();
  versions.onednn_isa_cap = OneDnnIsaCapName();
#ifdef LLMCTL_HAVE_CUDA
  // CUDART_VERSION as libtorch_cuda was compiled: the wheel's CUDA, whatever this machine has.
  versions.libtorch_cuda =
      CudaVersion::FromInt(static_cast<int>(at::detail::getCUDAHooks().versionCUDART())).ToString();
  int runtime = 0;
  if (versions.cuda_devices > 0 && cudaRuntimeGetVersion(&runtime) == cudaSuccess) {
    versions.cuda_runtime = CudaVersion::FromInt(runtime).ToString();
  }
#endif
  // NVML answers even when the driver is too old for LibTorch's CUDA: that is when it matters.
  if (auto nvml = nvml::OpenNvml(); nvml.ok()) {
    if (auto driver = (*nvml)->DriverVersion(); driver.ok()) versions.nvidia_driver = *driver;
    if (auto cuda = (*nvml)->DriverCudaVersion(); cuda.ok()) {
      versions.driver_cuda = cuda->ToString();
    }
  }
  return versions;
}

}  // namespace llmctl::trainer
