#include "trainer/dist/process_group.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <torch/cuda.h>
#include <unistd.h>

#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <thread>

#include "common/text.h"
#include "tests/support/shell_command.h"
#include "trainer/dist/c10d_check.h"

namespace llmctl::dist {
namespace {

// A socket listening on every address at a port the kernel picked; closed with the object.
class Listener {
 public:
  Listener() {
    fd_ = ::socket(AF_INET6, SOCK_STREAM, 0);
    const int off = 0;
    ::setsockopt(fd_, IPPROTO_IPV6, IPV6_V6ONLY, &off, sizeof(off));
    sockaddr_in6 address{};
    address.sin6_family = AF_INET6;
    address.sin6_addr = in6addr_any;
    ::bind(fd_, reinterpret_cast<sockaddr*>(&address), sizeof(address));
    ::listen(fd_, 1);
    socklen_t length = sizeof(address);
    ::getsockname(fd_, reinterpret_cast<sockaddr*>(&address), &length);
    port_ = ntohs(address.sin6_port);
  }
  ~Listener() { ::close(fd_); }
  uint16_t port() const { return port_; }

 private:
  int fd_ = -1;
  uint16_t port_ = 0;
};

// A port nothing listens on (a moment ago).
uint16_t FreePort() { return Listener().port(); }

RankEnv Env(int rank, int world_size, uint16_t port) {
  RankEnv env;
  env.rank = rank;
  env.local_rank = rank;
  env.world_size = world_size;
  env.master_addr = "127.0.0.1";
  env.master_port = port;
  return env;
}

ProcessGroupOptions Gloo(std::chrono::milliseconds rendezvous_timeout = std::chrono::seconds(30)) {
  ProcessGroupOptions options;
  options.backend = BackendKind::kGloo;
  options.rendezvous_timeout = rendezvous_timeout;
  return options;
}

at::Tensor Floats(std::vector<float> values) {
  return at::tensor(values, at::TensorOptions().dtype(at::kFloat));
}

// Two ranks as two threads of this process, each with its own process group, each collective's
// result compared with numbers written out by hand.
TEST(ProcessGroupTest, TwoGlooRanksGetEveryCollectiveExactlyRight) {
  const uint16_t port = FreePort();
  std::vector<std::string> failures(2);
  const auto rank_main = [&](int rank) {
    std::ostringstream failure;
    StatusOr<ProcessGroup> created = ProcessGroup::Create(Env(rank, 2, port), Gloo());
    if (!created.ok()) {
      failures[rank] = created.status().ToString();
      return;
    }
    ProcessGroup& group = *created;
    const auto check = [&](const Status& status, const at::Tensor& got, const at::Tensor& expected,
                           const char* what) {
      if (!status.ok()) failure << what << ": " << status.ToString() << "\n";
      if (!at::equal(got, expected)) failure << what << ": got " << got << "\n";
    };
    // Rank 0 holds 1, 2, 3 and rank 1 holds 10, 20, 30 (as bfloat16 too: all exact).
    for (at::ScalarType dtype : {at::kFloat, at::kBFloat16}) {
      const at::Tensor mine = (rank == 0 ? Floats({1, 2, 3}) : Floats({10, 20, 30})).to(dtype);
      at::Tensor sum = mine.clone();
      check(group.AllReduce(sum, ReduceOp::kSum), sum, Floats({11, 22, 33}).to(dtype),
            "all_reduce sum");
      at::Tensor mean = mine.clone();
      check(group.AllReduce(mean, ReduceOp::kAvg), mean, Floats({5.5, 11, 16.5}).to(dtype),
            "all_reduce avg");
      at::Tensor broadcast = mine.clone();
      check(group.Broadcast(broadcast, 1), broadcast, Floats({10, 20, 30}).to(dtype),
            "broadcast from rank 1");
      at::Tensor gathered = at::zeros({6}, dtype);
      check(group.AllGatherIntoTensor(gathered, mine), gathered,
            Floats({1, 2, 3, 10, 20, 30}).to(dtype), "all_gather_into_tensor");
      // A flat tensor of 3 elements padded to 4 (ShardNumel(3, 2) == 2): rank 0 gets elements 0-1
      // of the sum, rank 1 element 2 and the zero padding.
      const at::Tensor padded = at::cat({mine, at::zeros({1}, dtype)});
      at::Tensor shard = at::zeros({ShardNumel(3, 2)}, dtype);
      check(group.ReduceScatterTensor(shard, padded, ReduceOp::kSum), shard,
            (rank == 0 ? Floats({11, 22}) : Floats({33, 0})).to(dtype), "reduce_scatter sum");
      check(group.ReduceScatterTensor(shard, padded, ReduceOp::kAvg), shard,
            (rank == 0 ? Floats({5.5, 11}) : Floats({16.5, 0})).to(dtype), "reduce_scatter avg");
    }
    const Status barrier = group.Barrier();
    if (!barrier.ok()) failure << "barrier: " << barrier.ToString() << "\n";
    at::Tensor wrong_size = at::zeros({5});
    const Status refused = group.AllGatherIntoTensor(wrong_size, Floats({1, 2, 3}));
    if (refused.code() != StatusCode::kInvalidArgument) {
      failure << "a mis-sized all-gather output: " << refused.ToString() << "\n";
    }
    failures[rank] = failure.str();
  };
  std::thread rank1(rank_main, 1);
  rank_main(0);
  rank1.join();
  EXPECT_EQ(failures[0], "");
  EXPECT_EQ(failures[1], "");
}

TEST(ProcessGroupTest, ShardNumelRoundsUp) {
  EXPECT_EQ(ShardNumel(1, 2), 1);
  EXPECT_EQ(ShardNumel(4, 2), 2);
  EXPECT_EQ(ShardNumel(1000003, 4), 250001);
  EXPECT_EQ(ShardNumel(7, 8), 1);
}

TEST(ProcessGroupTest, AMasterPortInUseIsNamed) {
  Listener taken;
  StatusOr<ProcessGroup> group = ProcessGroup::Create(Env(0, 2, taken.port()), Gloo());
  ASSERT_FALSE(group.ok());
  EXPECT_EQ(group.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(group.status().message(), "rank 0 cannot serve the rendezvous store: MASTER_PORT " +
                                          std::to_string(taken.port()) +
                                          " is already in use on this host; choose a free port");
}

TEST(ProcessGroupTest, AnUnreachableMasterIsNamedAfterTheTimeout) {
  const uint16_t port = FreePort();
  StatusOr<ProcessGroup> group =
      ProcessGroup::Create(Env(1, 2, port), Gloo(std::chrono::seconds(2)));
  ASSERT_FALSE(group.ok());
  EXPECT_EQ(group.status().code(), StatusCode::kUnavailable);
  const std::string expected =
      "rank 1 cannot reach the rendezvous store of rank 0 at 127.0.0.1:" + std::to_string(port) +
      " (MASTER_ADDR:MASTER_PORT) within 2 s: ";
  EXPECT_EQ(group.status().message().substr(0, expected.size()), expected)
      << group.status().message();
}

// llm-c10d-check itself: two real rank processes under its launcher.
testing::CommandResult RunCheck(const std::string& args) {
  return testing::RunShellCommand((testing::BuildDir() / "trainer/llm-c10d-check").string() + " " +
                                  args + " 2>&1");
}

TEST(LlmC10dCheckTest, TwoGlooRanksOnCpuVerifyEveryCollective) {
  const uint16_t port = FreePort();
  const testing::CommandResult run = RunCheck(
      "--world-size 2 --backend gloo --device cpu --numel 1,7,4099 --port " + std::to_string(port));
  EXPECT_EQ(run.exit_code, 0) << run.out;
  std::set<std::string> seen;
  std::istringstream lines(run.out);
  std::string line;
  while (std::getline(lines, line)) {
    ASSERT_EQ(line.substr(0, 1), "{") << "not a JSON line: " << line << "\n" << run.out;
    const nlohmann::json result = nlohmann::json::parse(line);
    EXPECT_EQ(result["backend"], "gloo");
    EXPECT_EQ(result["device"], "cpu");
    EXPECT_EQ(result["world_size"], 2);
    EXPECT_EQ(result["ok"], true) << line;
    EXPECT_GT(result["seconds"].get<double>(), 0) << line;
    std::string key = result["op"].get<std::string>();
    if (!result["reduce"].is_null()) key += "/" + result["reduce"].get<std::string>();
    if (!result["dtype"].is_null()) {
      key += "/" + result["dtype"].get<std::string>() + "/" +
             std::to_string(result["numel"].get<int64_t>());
      EXPECT_GT(result["algbw_gbps"].get<double>(), 0) << line;
    }
    EXPECT_TRUE(seen.insert(key).second) << "twice: " << key;
  }
  // 6 collectives (two reductions each for all-reduce and reduce-scatter) x 2 dtypes x 3 lengths,
  // and the barrier.
  EXPECT_EQ(seen.size(), 37u) << run.out;
  EXPECT_TRUE(seen.count("reduce_scatter_tensor/avg/bfloat16/7"));
  EXPECT_TRUE(seen.count("all_gather_into_tensor/float32/1"));
  EXPECT_TRUE(seen.count("barrier"));
}

TEST(LlmC10dCheckTest, APortInUseFailsClearly) {
  Listener taken;
  const testing::CommandResult run =
      RunCheck("--world-size 2 --numel 7 --timeout 5 --port " + std::to_string(taken.port()));
  EXPECT_EQ(run.exit_code, kCheckExitFailed) << run.out;
  EXPECT_NE(run.out.find("rank 0 cannot serve the rendezvous store: MASTER_PORT " +
                         std::to_string(taken.port()) + " is already in use on this host"),
            std::string::npos)
      << run.out;
  // The launcher's line quotes rank 0's.
  EXPECT_NE(run.out.find("llm-c10d-check: rank 0 of 2 exited with code 1: rank 0 cannot serve the "
                         "rendezvous store: MASTER_PORT " +
                         std::to_string(taken.port()) + " is already in use on this host"),
            std::string::npos)
      << run.out;
}

TEST(LlmC10dCheckTest, NcclWantsOneGpuPerRank) {
  const int devices = torch::cuda::device_count();
  const testing::CommandResult run =
      RunCheck("--backend nccl --device cuda --world-size " + std::to_string(devices + 1) +
               " --port " + std::to_string(FreePort()));
  if (devices == 0) {
    EXPECT_EQ(run.exit_code, kCheckExitNoCuda) << run.out;
    EXPECT_NE(run.out.find("--device cuda: this machine has no CUDA device"), std::string::npos)
        << run.out;
  } else {
    EXPECT_EQ(run.exit_code, kCheckExitGpuPerRank) << run.out;
    EXPECT_NE(run.out.find("NCCL needs one distinct GPU per rank: " + std::to_string(devices + 1) +
                           " ranks on this machine but " +
                           CountOf(devices, "CUDA device", "CUDA devices") + "; use gloo"),
              std::string::npos)
        << run.out;
  }
}

TEST(LlmC10dCheckTest, NcclOnCpuIsAUsageError) {
  const testing::CommandResult run = RunCheck("--backend nccl --device cpu");
  EXPECT_EQ(run.exit_code, kCheckExitUsage) << run.out;
  EXPECT_NE(run.out.find("NCCL moves CUDA tensors only: use --device cuda with nccl"),
            std::string::npos)
      << run.out;
}

TEST(LlmC10dCheckTest, WithoutTorchrunsVariablesARankSaysWhichIsMissing) {
  const testing::CommandResult run = testing::RunShellCommand(
      "env -u WORLD_SIZE " + (testing::BuildDir() / "trainer/llm-c10d-check").string() +
      " --as-rank 2>&1");
  EXPECT_EQ(run.exit_code, kCheckExitUsage) << run.out;
  EXPECT_NE(run.out.find("llm-c10d-check: WORLD_SIZE is not set (a distributed rank needs RANK"),
            std::string::npos)
      << run.out;
}

}  // namespace
}  // namespace llmctl::dist
