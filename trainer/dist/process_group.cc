#include "trainer/dist/process_group.h"

#include <arpa/inet.h>
#include <c10/util/Exception.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#include <utility>
#include <vector>

#ifdef USE_C10D_NCCL
#include <c10/cuda/CUDAFunctions.h>

#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#endif

namespace llmctl::dist {
namespace {

// Every key this group writes lives under one prefix, so a later group (FSDP's, a second trial's)
// can share the same TCPStore without its keys colliding.
constexpr char kStorePrefix[] = "llmctl/default_pg/";

std::string Seconds(std::chrono::milliseconds duration) {
  return std::to_string(duration.count() / 1000) + " s";
}

std::string DescribeException(const std::exception& error) {
  if (const auto* c10_error = dynamic_cast<const c10::Error*>(&error)) {
    return c10_error->what_without_backtrace();
  }
  return error.what();
}

// The listening socket rank 0 serves the store on: the launcher's (kMasterListenFdVariable) when it
// chose the port, else MASTER_PORT bound here: binding here, rather than inside c10d, tells "the
// port is in use" apart from every other failure and leaves no window for another process to take
// it.
StatusOr<int> MasterListenFd(const RankEnv& env) {
  const char* inherited = std::getenv(kMasterListenFdVariable);
  if (inherited != nullptr && *inherited != '\0') {
    char* end = nullptr;
    const long fd = std::strtol(inherited, &end, 10);
    if (*end != '\0' || fd < 3 || fd > INT32_MAX ||
        ListeningPort(static_cast<int>(fd)) != env.master_port) {
      return InvalidArgumentError(std::string(kMasterListenFdVariable) + "=" + inherited +
                                  " is no socket listening on MASTER_PORT " +
                                  std::to_string(env.master_port));
    }
    ::fcntl(static_cast<int>(fd), F_SETFD, FD_CLOEXEC);  // the TCPStore owns it from here
    return static_cast<int>(fd);
  }
  return ListenOnMasterPort(env.master_port);
}

StatusOr<c10::intrusive_ptr<c10d::Store>> ConnectStore(const RankEnv& env,
                                                       const ProcessGroupOptions& options) {
  c10d::TCPStoreOptions store_options;
  store_options.port = env.master_port;
  store_options.isServer = env.rank == 0;
  store_options.numWorkers = static_cast<size_t>(env.world_size);
  store_options.waitWorkers = true;
  store_options.timeout = options.rendezvous_timeout;
  if (store_options.isServer) {
    ASSIGN_OR_RETURN(store_options.masterListenFd, MasterListenFd(env));
  }
  const std::string where = env.master_addr + ":" + std::to_string(env.master_port);
  try {
    c10::intrusive_ptr<c10d::Store> store =
        c10::make_intrusive<c10d::TCPStore>(env.master_addr, store_options);
    return c10::make_intrusive<c10d::PrefixStore>(kStorePrefix, std::move(store));
  } catch (const std::exception& error) {
    if (store_options.isServer) {
      return UnavailableError("rank 0 served the rendezvous store on " + where + " but not all " +
                              std::to_string(env.world_size) + " ranks joined within " +
                              Seconds(options.rendezvous_timeout) + ": " +
                              DescribeException(error));
    }
    return UnavailableError("rank " + std::to_string(env.rank) +
                            " cannot reach the rendezvous store of rank 0 at " + where +
                            " (MASTER_ADDR:MASTER_PORT) within " +
                            Seconds(options.rendezvous_timeout) + ": " + DescribeException(error));
  }
}

StatusOr<c10::intrusive_ptr<c10d::Backend>> CreateBackend(
    const RankEnv& env, const ProcessGroupOptions& options,
    const c10::intrusive_ptr<c10d::Store>& store) {
  try {
    switch (options.backend) {
      case BackendKind::kGloo: {
        auto gloo_options = c10d::ProcessGroupGloo::Options::create(options.collective_timeout);
        // As torch.distributed does: the interface GLOO_SOCKET_IFNAME names, else the address
        // this host's name resolves to (loopback when it resolves to none).
        const char* interface = std::getenv("GLOO_SOCKET_IFNAME");
        gloo_options->devices.push_back(
            interface != nullptr && *interface != '\0'
                ? c10d::ProcessGroupGloo::createDeviceForInterface(interface)
                : c10d::ProcessGroupGloo::createDefaultDevice());
        return c10::intrusive_ptr<c10d::Backend>(c10::make_intrusive<c10d::ProcessGroupGloo>(
            store, env.rank, env.world_size, std::move(gloo_options)));
      }
      case BackendKind::kNccl: {
#ifdef USE_C10D_NCCL
        c10::cuda::set_device(static_cast<c10::DeviceIndex>(options.cuda_device));
        auto nccl_options = c10d::ProcessGroupNCCL::Options::create();
        nccl_options->timeout = options.collective_timeout;
        auto nccl = c10::make_intrusive<c10d::ProcessGroupNCCL>(store, env.rank, env.world_size,
                                                                std::move(nccl_options));
        // Bound to its GPU and connected now, so a broken NCCL setup fails here, not at the
        // first gradient all-reduce.
        const at::Device device(at::kCUDA, static_cast<c10::DeviceIndex>(options.cuda_device));
        nccl->setBoundDeviceId(device);
        nccl->eagerConnectSingleDevice(device);
        return c10::intrusive_ptr<c10d::Backend>(std::move(nccl));
#else
        return FailedPreconditionError(
            "this build has no NCCL (the LibTorch it links is not the CUDA build)");
#endif
      }
    }
  } catch (const std::exception& error) {
    return UnavailableError("rank " + std::to_string(env.rank) + " cannot start the " +
                            std::string(BackendKindName(options.backend)) +
                            " process group: " + DescribeException(error));
  }
  return InternalError("unknown backend");
}

// Runs one collective and waits for it; c10d reports failures (a dead peer, a timeout, a
// mismatched call) by throwing, which stops here.
template <typename Start>
Status RunCollective(std::string_view name, int rank, Start start) {
  try {
    c10::intrusive_ptr<c10d::Work> work = start();
    work->wait();
    return Status::Ok();
  } catch (const std::exception& error) {
    return UnavailableError(std::string(name) + " failed on rank " + std::to_string(rank) + ": " +
                            DescribeException(error));
  }
}

}  // namespace

StatusOr<BackendKind> ParseBackendKind(std::string_view name) {
  if (name == "gloo") return BackendKind::kGloo;
  if (name == "nccl") return BackendKind::kNccl;
  return InvalidArgumentError("unknown backend '" + std::string(name) + "': expected gloo or nccl");
}

std::string_view BackendKindName(BackendKind kind) {
  return kind == BackendKind::kGloo ? "gloo" : "nccl";
}

bool BackendKindCompiled(BackendKind kind) {
#ifdef USE_C10D_NCCL
  return true;
#else
  return kind == BackendKind::kGloo;
#endif
}

int64_t ShardNumel(int64_t numel, int world_size) { return (numel + world_size - 1) / world_size; }

StatusOr<ProcessGroup> ProcessGroup::Create(const RankEnv& env,
                                            const ProcessGroupOptions& options) {
  if (!BackendKindCompiled(options.backend)) {
    return FailedPreconditionError("this build has no " +
                                   std::string(BackendKindName(options.backend)) +
                                   " (the LibTorch it links is not the CUDA build)");
  }
  ASSIGN_OR_RETURN(c10::intrusive_ptr<c10d::Store> store, ConnectStore(env, options));
  ASSIGN_OR_RETURN(c10::intrusive_ptr<c10d::Backend> backend, CreateBackend(env, options, store));
  return ProcessGroup(env.rank, env.world_size, options.backend, options.cuda_device,
                      std::move(store), std::move(backend));
}

ProcessGroup::ProcessGroup(int rank, int world_size, BackendKind backend_kind, int cuda_device,
                           c10::intrusive_ptr<c10d::Store> store,
                           c10::intrusive_ptr<c10d::Backend> backend)
    : rank_(rank),
      world_size_(world_size),
      backend_kind_(backend_kind),
      cuda_device_(cuda_device),
      store_(std::move(store)),
      backend_(std::move(backend)) {}

ProcessGroup::~ProcessGroup() {
  if (!backend_) return;  // moved from
  // Ends NCCL's communicators and watchdog in order (its destructor would too, with a warning that
  // the group was not shut down); Gloo has nothing to do.
  try {
    backend_->shutdown();
  } catch (const std::exception&) {
    // Shutting down after a failed collective: nothing more to report.
  }
}

c10d::ReduceOp ProcessGroup::NativeOp(ReduceOp op) const {
  if (op == ReduceOp::kAvg && backend_kind_ == BackendKind::kNccl) return c10d::ReduceOp::AVG;
  return c10d::ReduceOp::SUM;
}

Status ProcessGroup::AllReduce(at::Tensor& tensor, ReduceOp op) {
  ASSIGN_OR_RETURN(PendingCollective pending, StartAllReduce(tensor, op));
  return pending.Wait();
}

StatusOr<PendingCollective> ProcessGroup::Start(std::string_view name, at::Tensor output,
                                                ReduceOp op,
                                                const std::function<WorkPtr()>& start) {
  try {
    c10::intrusive_ptr<c10d::Work> work = start();
    const bool divide = op == ReduceOp::kAvg && backend_kind_ != BackendKind::kNccl;
    return PendingCollective(name, std::move(work), std::move(output), divide ? world_size_ : 1,
                             rank_);
  } catch (const std::exception& error) {
    return UnavailableError(std::string(name) + " failed on rank " + std::to_string(rank_) + ": " +
                            DescribeException(error));
  }
}

StatusOr<PendingCollective> ProcessGroup::StartAllReduce(at::Tensor& tensor, ReduceOp op) {
  c10d::AllreduceOptions options;
  options.reduceOp = NativeOp(op);
  std::vector<at::Tensor> tensors = {tensor};
  return Start("all_reduce", tensor, op, [&] { return backend_->allreduce(tensors, options); });
}

Status PendingCollective::Wait() {
  try {
    work_->wait();
  } catch (const std::exception& error) {
    return UnavailableError(std::string(name_) + " failed on rank " + std::to_string(rank_) + ": " +
                            DescribeException(error));
  }
  if (divisor_ > 1) output_.div_(divisor_);
  return Status::Ok();
}

Status ProcessGroup::Broadcast(at::Tensor& tensor, int root) {
  if (root < 0 || root >= world_size_) {
    return InvalidArgumentError("broadcast root " + std::to_string(root) + " is not a rank of " +
                                std::to_string(world_size_));
  }
  c10d::BroadcastOptions options;
  options.rootRank = root;
  std::vector<at::Tensor> tensors = {tensor};
  return RunCollective("broadcast", rank_, [&] { return backend_->broadcast(tensors, options); });
}

// All-gather and reduce-scatter go through the names every PyTorch from 2.8 on has
// (_allgather_base, _reduce_scatter_base; 2.15 forwards them to all_gather_single and
// reduce_scatter_single): a GPU machine builds llm-train against its own PyTorch.
Status ProcessGroup::AllGatherIntoTensor(at::Tensor& output, const at::Tensor& input) {
  ASSIGN_OR_RETURN(PendingCollective pending, StartAllGatherIntoTensor(output, input));
  return pending.Wait();
}

StatusOr<PendingCollective> ProcessGroup::StartAllGatherIntoTensor(at::Tensor& output,
                                                                   const at::Tensor& input) {
  if (output.numel() != input.numel() * world_size_) {
    return InvalidArgumentError("all_gather_into_tensor: the output has " +
                                std::to_string(output.numel()) + " elements, not world size " +
                                std::to_string(world_size_) + " x input " +
                                std::to_string(input.numel()));
  }
  at::Tensor in = input;
  return Start("all_gather_into_tensor", output, ReduceOp::kSum,
               [&] { return backend_->_allgather_base(output, in); });
}

Status ProcessGroup::ReduceScatterTensor(at::Tensor& output, const at::Tensor& input, ReduceOp op) {
  ASSIGN_OR_RETURN(PendingCollective pending, StartReduceScatterTensor(output, input, op));
  return pending.Wait();
}

StatusOr<PendingCollective> ProcessGroup::StartReduceScatterTensor(at::Tensor& output,
                                                                   const at::Tensor& input,
                                                                   ReduceOp op) {
  if (input.numel() != output.numel() * world_size_) {
    return InvalidArgumentError("reduce_scatter_tensor: the input has " +
                                std::to_string(input.numel()) + " elements, not world size " +
                                std::to_string(world_size_) + " x output " +
                                std::to_string(output.numel()));
  }
  c10d::ReduceScatterOptions options;
  options.reduceOp = NativeOp(op);
  at::Tensor in = input;
  return Start("reduce_scatter_tensor", output, op,
               [&] { return backend_->_reduce_scatter_base(output, in, options); });
}

Status ProcessGroup::Barrier() {
  c10d::BarrierOptions options;
  if (backend_kind_ == BackendKind::kNccl) options.device_ids = {cuda_device_};
  return RunCollective("barrier", rank_, [&] { return backend_->barrier(options); });
}

}  // namespace llmctl::dist
