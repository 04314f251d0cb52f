#include "trainer/dist/c10d_check.h"

#include <ATen/ATen.h>
#include <torch/cuda.h>

#include <algorithm>
#include <chrono>
#include <functional>
#include <nlohmann/json.hpp>
#include <sstream>

#include "common/text.h"

namespace llmctl::dist {
namespace {

// Each timed case moves about this many bytes in all (at least one and at most 20 repetitions).
constexpr int64_t kTimedBytes = int64_t{256} << 20;
constexpr int kMaxRepetitions = 20;

struct Case {
  std::string op;
  std::optional<ReduceOp> reduce;
  at::ScalarType dtype = at::kFloat;
  int64_t numel = 0;  // the flat tensor's length before padding; 0 for barrier
};

// A case ready to run: `run` performs the collective on buffers it owns; after the first run
// `result` must equal `expected`. `bytes` is the data volume nccl-tests' algorithm bandwidth
// counts: the tensor for all-reduce and broadcast, the gathered or scattered whole for
// all-gather and reduce-scatter.
struct Prepared {
  std::function<Status()> run;
  at::Tensor result;
  at::Tensor expected;
  int64_t bytes = 0;
};

struct Mismatch {
  int64_t count = 0;
  int64_t first = -1;
  double got = 0;
  double expected = 0;
};

std::string_view DtypeName(at::ScalarType dtype) {
  return dtype == at::kBFloat16 ? "bfloat16" : "float32";
}

std::string_view ReduceName(ReduceOp op) { return op == ReduceOp::kSum ? "sum" : "avg"; }

// Element g of every rank's input is a small whole number, so sums and means (a multiple of
// 1/2 for two ranks) are exact in float32 and bfloat16 alike, whatever order a backend adds in.
// Padding past the flat length is zero, as FSDP pads.
at::Tensor Pattern(const at::Tensor& index, int64_t modulus, int64_t offset, int64_t numel,
                   at::ScalarType dtype) {
  at::Tensor values = index.remainder(modulus).add(offset);
  return values.masked_fill(index.ge(numel), 0).to(dtype);
}

Prepared Prepare(ProcessGroup& group, const Case& c, const at::TensorOptions& on) {
  const int rank = group.rank();
  const int ranks = group.world_size();
  const int64_t element = c10::elementSize(c.dtype);
  const at::TensorOptions index_options = on.dtype(at::kLong);
  const double rank_sum = ranks * (ranks - 1) / 2.0;  // 0 + 1 + ... + ranks-1
  Prepared prepared;
  if (c.op == "all_reduce") {
    const at::Tensor index = at::arange(c.numel, index_options);
    at::Tensor tensor = Pattern(index, 17, rank, c.numel, c.dtype);
    at::Tensor base = index.remainder(17).to(at::kDouble);
    prepared.expected =
        (*c.reduce == ReduceOp::kSum ? base.mul(ranks).add(rank_sum) : base.add(rank_sum / ranks))
            .to(c.dtype);
    prepared.result = tensor;
    prepared.bytes = c.numel * element;
    prepared.run = [&group, tensor, op = *c.reduce]() mutable {
      return group.AllReduce(tensor, op);
    };
  } else if (c.op == "broadcast") {
    // From the last rank, so a broadcast that ignores its root fails.
    const int root = ranks - 1;
    const at::Tensor index = at::arange(c.numel, index_options);
    prepared.expected = Pattern(index, 251, -125, c.numel, c.dtype);
    at::Tensor tensor =
        rank == root ? prepared.expected.clone() : at::full({c.numel}, -1, on.dtype(c.dtype));
    prepared.result = tensor;
    prepared.bytes = c.numel * element;
    prepared.run = [&group, tensor, root]() mutable { return group.Broadcast(tensor, root); };
  } else if (c.op == "all_gather_into_tensor") {
    const int64_t shard = ShardNumel(c.numel, ranks);
    const at::Tensor index = at::arange(shard * ranks, index_options);
    prepared.expected = Pattern(index, 251, -125, c.numel, c.dtype);
    at::Tensor input = prepared.expected.slice(0, rank * shard, (rank + 1) * shard).clone();
    at::Tensor output = at::full({shard * ranks}, -1, on.dtype(c.dtype));
    prepared.result = output;
    prepared.bytes = shard * ranks * element;
    prepared.run = [&group, input, output]() mutable {
      return group.AllGatherIntoTensor(output, input);
    };
  } else if (c.op == "reduce_scatter_tensor") {
    const int64_t shard = ShardNumel(c.numel, ranks);
    const at::Tensor index = at::arange(shard * ranks, index_options);
    at::Tensor input = Pattern(index, 13, rank, c.numel, c.dtype);
    at::Tensor base = index.remainder(13).to(at::kDouble);
    at::Tensor whole =
        (*c.reduce == ReduceOp::kSum ? base.mul(ranks).add(rank_sum) : base.add(rank_sum / ranks))
            .masked_fill(index.ge(c.numel), 0);
    prepared.expected = whole.slice(0, rank * shard, (rank + 1) * shard).to(c.dtype);
    at::Tensor output = at::full({shard}, -1, on.dtype(c.dtype));
    prepared.result = output;
    prepared.bytes = shard * ranks * element;
    prepared.run = [&group, input, output, op = *c.reduce]() mutable {
      return group.ReduceScatterTensor(output, input, op);
    };
  } else {  // barrier
    prepared.run = [&group] { return group.Barrier(); };
  }
  return prepared;
}

Mismatch Compare(const at::Tensor& got, const at::Tensor& expected) {
  Mismatch mismatch;
  if (!expected.defined()) return mismatch;
  const at::Tensor wrong = got.ne(expected);  // NaN counts as wrong
  mismatch.count = wrong.sum().item<int64_t>();
  if (mismatch.count > 0) {
    mismatch.first = wrong.nonzero()[0][0].item<int64_t>();
    mismatch.got = got[mismatch.first].item<double>();
    mismatch.expected = expected[mismatch.first].item<double>();
  }
  return mismatch;
}

std::string Describe(const Case& c) {
  std::ostringstream text;
  text << c.op;
  if (c.reduce) text << " (" << ReduceName(*c.reduce) << ")";
  if (c.op != "barrier") text << " " << DtypeName(c.dtype) << " numel " << c.numel;
  return text.str();
}

std::vector<Case> Cases(const std::vector<int64_t>& numels) {
  std::vector<Case> cases;
  for (at::ScalarType dtype : {at::kFloat, at::kBFloat16}) {
    for (int64_t numel : numels) {
      cases.push_back({"all_reduce", ReduceOp::kSum, dtype, numel});
      cases.push_back({"all_reduce", ReduceOp::kAvg, dtype, numel});
      cases.push_back({"broadcast", std::nullopt, dtype, numel});
      cases.push_back({"all_gather_into_tensor", std::nullopt, dtype, numel});
      cases.push_back({"reduce_scatter_tensor", ReduceOp::kSum, dtype, numel});
      cases.push_back({"reduce_scatter_tensor", ReduceOp::kAvg, dtype, numel});
    }
  }
  cases.push_back({"barrier", std::nullopt, at::kFloat, 0});
  return cases;
}

// Where a rank's collectives run, and how to wait for them (a CUDA stream's work ends later).
struct Placement {
  at::TensorOptions on;
  bool cuda = false;
  int cuda_device = 0;
  void Synchronize() const {
    if (cuda) torch::cuda::synchronize(cuda_device);
  }
};

// Runs the prepared case once and checks its result: true when every rank's was right (the wrong
// elements summed over the ranks, so rank 0's line speaks for all). A rank's own mismatch goes to
// `err`; an error means a collective failed, and the other ranks may be stuck in it.
StatusOr<bool> CheckOnEveryRank(ProcessGroup& group, const Case& c, Prepared& prepared,
                                const Placement& placement, const std::string& who,
                                std::ostream& err) {
  Status ran = prepared.run();
  if (!ran.ok()) return Status(ran.code(), Describe(c) + ": " + ran.message());
  const Mismatch mismatch = Compare(prepared.result, prepared.expected);
  if (mismatch.count > 0) {
    err << who << Describe(c) << ": " << mismatch.count << " wrong element(s); element "
        << mismatch.first << " is " << mismatch.got << ", expected " << mismatch.expected
        << std::endl;
  }
  at::Tensor wrong = at::full({1}, mismatch.count, placement.on.dtype(at::kLong));
  Status counted = group.AllReduce(wrong, ReduceOp::kSum);
  if (!counted.ok()) {
    return Status(counted.code(), "summing the ranks' verdicts: " + counted.message());
  }
  return wrong.item<int64_t>() == 0;
}

// Seconds a run of the prepared case takes, the mean of enough repetitions to move about
// kTimedBytes, started together on every rank.
StatusOr<double> TimeOnEveryRank(ProcessGroup& group, const Case& c, Prepared& prepared,
                                 const Placement& placement) {
  const int repetitions = static_cast<int>(std::clamp<int64_t>(
      prepared.bytes > 0 ? kTimedBytes / prepared.bytes : kMaxRepetitions, 1, kMaxRepetitions));
  Status timed = group.Barrier();
  placement.Synchronize();
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < repetitions && timed.ok(); ++i) timed = prepared.run();
  placement.Synchronize();
  if (!timed.ok()) return Status(timed.code(), Describe(c) + " (timed): " + timed.message());
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() /
         repetitions;
}

// Rank 0's JSON line for one case.
nlohmann::json CaseLine(const CheckOptions& options, const RankEnv& env, const Case& c,
                        int64_t bytes, bool ok, double seconds) {
  return {
      {"backend", BackendKindName(options.backend)},
      {"device", DeviceKindName(options.device)},
      {"world_size", env.world_size},
      {"op", c.op},
      {"reduce", c.reduce ? nlohmann::json(ReduceName(*c.reduce)) : nlohmann::json()},
      {"dtype", c.op == "barrier" ? nlohmann::json() : nlohmann::json(DtypeName(c.dtype))},
      {"numel", c.numel},
      {"bytes", bytes},
      {"ok", ok},
      {"seconds", seconds},
      {"algbw_gbps", bytes > 0 ? nlohmann::json(bytes / seconds / 1e9) : nlohmann::json()},
  };
}

}  // namespace

StatusOr<DeviceKind> ParseDeviceKind(std::string_view name) {
  if (name == "cpu") return DeviceKind::kCpu;
  if (name == "cuda") return DeviceKind::kCuda;
  return InvalidArgumentError("unknown device '" + std::string(name) + "': expected cpu or cuda");
}

std::string_view DeviceKindName(DeviceKind kind) {
  return kind == DeviceKind::kCpu ? "cpu" : "cuda";
}

std::optional<Refusal> RefuseMachine(const CheckOptions& options, int local_ranks) {
  if (options.backend == BackendKind::kNccl && options.device != DeviceKind::kCuda) {
    return Refusal{kCheckExitUsage, "NCCL moves CUDA tensors only: use --device cuda with nccl"};
  }
  if (!BackendKindCompiled(options.backend)) {
    return Refusal{kCheckExitNoCuda,
                   "this build has no NCCL: it links LibTorch without CUDA, so there is no CUDA "
                   "device to use"};
  }
  if (options.device != DeviceKind::kCuda) return std::nullopt;
  const int devices = torch::cuda::device_count();
  if (devices == 0) {
    return Refusal{kCheckExitNoCuda,
                   "--device cuda: this machine has no CUDA device that LibTorch can see (no "
                   "GPU, no NVIDIA driver, or CUDA_VISIBLE_DEVICES hides them)"};
  }
  if (options.backend == BackendKind::kNccl && devices < local_ranks) {
    return Refusal{kCheckExitGpuPerRank,
                   "NCCL needs one distinct GPU per rank: " + std::to_string(local_ranks) +
                       " ranks on this machine but " +
                       CountOf(devices, "CUDA device", "CUDA devices") +
                       "; use gloo to share a GPU, or fewer ranks"};
  }
  return std::nullopt;
}

int RunCheckRank(const RankEnv& env, const CheckOptions& options, std::ostream& out,
                 std::ostream& err) {
  const std::string who = "rank " + std::to_string(env.rank) + ": ";
  if (std::optional<Refusal> refusal =
          RefuseMachine(options, env.local_world_size.value_or(env.world_size))) {
    err << who << refusal->message << std::endl;
    return refusal->exit_code;
  }
  Placement placement;
  placement.cuda = options.device == DeviceKind::kCuda;
  // NCCL owns one GPU per rank; Gloo ranks may share one.
  placement.cuda_device =
      placement.cuda ? env.local_rank % std::max(1, int(torch::cuda::device_count())) : 0;
  placement.on = placement.cuda
                     ? at::TensorOptions().device(
                           at::kCUDA, static_cast<c10::DeviceIndex>(placement.cuda_device))
                     : at::TensorOptions().device(at::kCPU);

  ProcessGroupOptions group_options;
  group_options.backend = options.backend;
  group_options.rendezvous_timeout = options.rendezvous_timeout;
  group_options.cuda_device = placement.cuda_device;
  StatusOr<ProcessGroup> created = ProcessGroup::Create(env, group_options);
  if (!created.ok()) {
    err << created.status().message() << std::endl;
    return kCheckExitFailed;
  }
  ProcessGroup& group = *created;

  bool all_ok = true;
  for (const Case& c : Cases(options.numels)) {
    Prepared prepared = Prepare(group, c, placement.on);
    // A failed collective ends the check: the other ranks may be stuck in it, and the launcher
    // stops them.
    StatusOr<bool> ok = CheckOnEveryRank(group, c, prepared, placement, who, err);
    if (!ok.ok()) {
      err << ok.status().message() << std::endl;
      return kCheckExitFailed;
    }
    all_ok = all_ok && *ok;
    StatusOr<double> seconds = TimeOnEveryRank(group, c, prepared, placement);
    if (!seconds.ok()) {
      err << seconds.status().message() << std::endl;
      return kCheckExitFailed;
    }
    if (env.rank == 0) {
      out << CaseLine(options, env, c, prepared.bytes, *ok, *seconds).dump() << std::endl;
    }
  }
  return all_ok ? kCheckExitOk : kCheckExitFailed;
}

}  // namespace llmctl::dist
