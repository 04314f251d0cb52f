#include "trainer/quant/quant.h"

#include <ATen/Parallel.h>
#include <ATen/Version.h>
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <string>

#include "common/safetensors/safetensors.h"
#include "trainer/memory/counting_allocator.h"
#include "trainer/model/weights.h"
#include "trainer/testing/trial_runner.h"

namespace llmctl::trainer {
namespace {

// tests/fixtures/quant/<name>, written by scripts/fixtures/make_bnb_fixtures.py from bitsandbytes
// 0.50.2.
std::map<std::string, torch::Tensor> LoadFixture(const std::string& name) {
  return testing::LoadTensorFixture("quant/" + name);
}

void ExpectBitEqual(const torch::Tensor& actual, const torch::Tensor& expected,
                    const std::string& what) {
  ASSERT_TRUE(expected.defined()) << what << " missing from the fixture";
  ASSERT_EQ(actual.scalar_type(), expected.scalar_type()) << what;
  ASSERT_EQ(actual.numel(), expected.numel()) << what;
  EXPECT_TRUE(torch::equal(actual.reshape(-1), expected.reshape(-1)))
      << what << ": " << actual.reshape(-1).ne(expected.reshape(-1)).sum().item<int64_t>()
      << " elements differ";
}

double Seconds(const std::chrono::steady_clock::time_point& start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

TEST(DynamicMapTest, MatchesBitsandbytes) {
  auto fixture = LoadFixture("dynamic_maps.safetensors");
  ExpectBitEqual(DynamicMap(/*is_signed=*/true), fixture["signed"], "signed map");
  ExpectBitEqual(DynamicMap(/*is_signed=*/false), fixture["unsigned"], "unsigned map");
}

TEST(Blockwise8bitTest, MatchesBitsandbytesWithTailBlock) {
  auto fixture = LoadFixture("blockwise.safetensors");
  const torch::Tensor x = fixture["x"];  // 1000 elements: 3 blocks of 256 and a tail of 232
  for (const bool is_signed : {true, false}) {
    const std::string name = is_signed ? "signed" : "unsigned";
    const torch::Tensor map = DynamicMap(is_signed);
    Blockwise8bit q = QuantizeBlockwise8bit(is_signed ? x : x.abs(), map, 256);
    ExpectBitEqual(q.codes, fixture[name + ".codes"], name + " codes");
    ExpectBitEqual(q.absmax, fixture[name + ".absmax"], name + " absmax");
    ExpectBitEqual(DequantizeBlockwise8bit(q, map), fixture[name + ".dequant"], name + " dequant");
  }
}

TEST(Nf4Test, MatchesBitsandbytes) {
  auto fixture = LoadFixture("nf4.safetensors");
  for (const std::string name : {"w64x128_f32", "w64x128_bf16", "w37x75_f32"}) {
    const torch::Tensor weight = fixture[name + ".weight"];
    Nf4Weight plain = QuantizeNf4(weight, /*double_quant=*/false);
    ExpectBitEqual(plain.packed, fixture[name + ".packed"], name + " packed");
    ExpectBitEqual(plain.absmax, fixture[name + ".plain.absmax"], name + " absmax");
    ExpectBitEqual(DequantizeNf4(plain, weight.scalar_type()), fixture[name + ".plain.dequant"],
                   name + " dequant");

    Nf4Weight nested = QuantizeNf4(weight, /*double_quant=*/true);
    ExpectBitEqual(nested.packed, fixture[name + ".packed"], name + " packed (double quant)");
    ExpectBitEqual(nested.quantized_absmax, fixture[name + ".double.quantized_absmax"],
                   name + " quantized absmax");
    ExpectBitEqual(nested.nested_absmax, fixture[name + ".double.nested_absmax"],
                   name + " nested absmax");
    EXPECT_EQ(nested.offset.item<float>(), fixture[name + ".double.offset"].item<float>()) << name;
    ExpectBitEqual(DequantizeNf4(nested, weight.scalar_type()), fixture[name + ".double.dequant"],
                   name + " dequant (double quant)");
    EXPECT_EQ(DequantizeNf4(nested, torch::kFloat32).sizes(), weight.sizes());
  }
}

// A 4096x4096 weight: 4 bits + one fp32 absmax per 64 = 4.5 bits; with double quantisation 4 + 8/64
// + 32/(64*256) + 32 bits of offset = 4.127 bits. Also times quantise and dequantise (printed).
TEST(Nf4Test, BitsPerParamAndThroughputFor4096x4096) {
  torch::manual_seed(0);
  const torch::Tensor weight = torch::randn({4096, 4096}).mul_(0.02).to(torch::kBFloat16);
  const double numel = static_cast<double>(weight.numel());
  for (const bool double_quant : {false, true}) {
    auto start = std::chrono::steady_clock::now();
    Nf4Weight w = QuantizeNf4(weight, double_quant);
    const double quantize_s = Seconds(start);
    start = std::chrono::steady_clock::now();
    torch::Tensor dense = DequantizeNf4(w, torch::kBFloat16);
    const double dequantize_s = Seconds(start);
    const int64_t blocks = weight.numel() / 64;
    const int64_t expected_bytes = double_quant
                                       ? weight.numel() / 2 + blocks + 4 * (blocks / 256) + 4
                                       : weight.numel() / 2 + 4 * blocks;
    EXPECT_EQ(w.bytes(), expected_bytes);
    const double bits = 8.0 * static_cast<double>(w.bytes()) / numel;
    EXPECT_GE(bits, 4.1);
    EXPECT_LE(bits, 4.6);
    std::printf(
        "NF4 4096x4096 %s: %.4f bits/param; quantise %.1f ms (%.0f Mparam/s), dequantise to bf16 "
        "%.1f ms "
        "(%.0f Mparam/s)\n",
        double_quant ? "double quant" : "plain", bits, quantize_s * 1e3, numel / quantize_s / 1e6,
        dequantize_s * 1e3, numel / dequantize_s / 1e6);
    // NF4's worst case is half the widest gap between codes (0.16) times the block absmax.
    EXPECT_LT((dense.to(torch::kFloat32) - weight.to(torch::kFloat32)).abs().max().item<float>(),
              0.2f * 0.12f);
  }
}

// Bitwise equality (so -0 differs from 0), except that any NaN equals any NaN: ATen's reductions do
// not all return the same NaN bits.
void ExpectSameBits(const torch::Tensor& actual, const torch::Tensor& expected,
                    const std::string& what) {
  ASSERT_EQ(actual.scalar_type(), expected.scalar_type()) << what;
  ASSERT_EQ(actual.sizes(), expected.sizes()) << what;
  if (actual.scalar_type() != torch::kFloat32) {
    EXPECT_TRUE(torch::equal(actual, expected))
        << what << ": " << actual.ne(expected).sum().item<int64_t>() << " elements differ";
    return;
  }
  const auto bits = [](const torch::Tensor& t) {
    return torch::where(t.isnan(), torch::zeros_like(t), t).view(torch::kInt32);
  };
  const torch::Tensor differ =
      bits(actual).ne(bits(expected)).logical_or_(actual.isnan().logical_xor(expected.isnan()));
  EXPECT_EQ(differ.sum().item<int64_t>(), 0) << what << ": elements differ";
}

// Values on and next to every midpoint between neighbouring codes of `code` (the ties the nearest-
// code search must resolve as the ATen path does), led by 1 so that a block holding them has absmax
// 1 and is scaled exactly.
torch::Tensor MidpointProbes(const torch::Tensor& code) {
  const torch::Tensor mid = (code.slice(0, 0, -1) + code.slice(0, 1)) / 2.0;
  const torch::Tensor up = torch::nextafter(mid, torch::full_like(mid, 2.0));
  const torch::Tensor down = torch::nextafter(mid, torch::full_like(mid, -2.0));
  return torch::cat({torch::ones({1}), mid, up, down});
}

// The CPU fast path against the ATen path (internal::QuantizeBlockwise8bitAten): random blocks of
// each float dtype with short tails, a zero block, the midpoints (exact ties), inf and NaN, a
// non-contiguous view, and several block sizes.
TEST(Blockwise8bitTest, CpuPathMatchesAtenPath) {
  torch::manual_seed(7);
  for (const bool is_signed : {true, false}) {
    const torch::Tensor map = DynamicMap(is_signed);
    const torch::Tensor probes = MidpointProbes(map);  // 1 + 3 * 255: 766
    // The probes start a block for block sizes 64 and 256.
    torch::Tensor x = torch::cat({torch::randn({5120}) * 3e-3, torch::zeros({256}), probes,
                                  probes.slice(0, 0, 100) * 0.5, torch::randn({77})});
    if (!is_signed) x = x.abs();
    torch::Tensor special = torch::randn({600});
    special[5] = INFINITY;
    special[300] = std::nan("");
    special[599] = -INFINITY;
    for (const torch::ScalarType dtype : {torch::kFloat32, torch::kBFloat16, torch::kHalf}) {
      for (const int64_t blocksize : {64, 256, 4096}) {
        for (const torch::Tensor& input : {x, special, x.slice(0, 0, 4000).view({40, 100}).t()}) {
          const torch::Tensor typed = input.to(dtype);
          const std::string what =
              std::string(is_signed ? "signed " : "unsigned ") + torch::toString(dtype) +
              " blocksize " + std::to_string(blocksize) + " numel " + std::to_string(input.numel());
          Blockwise8bit fast = QuantizeBlockwise8bit(typed, map, blocksize);
          Blockwise8bit aten = internal::QuantizeBlockwise8bitAten(typed, map, blocksize);
          ExpectSameBits(fast.codes, aten.codes, what + " codes");
          ExpectSameBits(fast.absmax, aten.absmax, what + " absmax");
        }
      }
    }
  }
}

// The same for NF4, plain and double quantised: odd element counts (a padded last byte), tails,
// exact ties on the NF4 midpoints, fp32/bf16/fp16 and a non-contiguous weight.
TEST(Nf4Test, CpuPathMatchesAtenPath) {
  torch::manual_seed(8);
  const torch::Tensor probes = MidpointProbes(Nf4CodeTable());  // 1 + 3 * 15: 46
  const torch::Tensor tied = torch::cat({probes, torch::zeros({18}), probes * -0.25}).view({2, 55});
  for (const torch::ScalarType dtype : {torch::kFloat32, torch::kBFloat16, torch::kHalf}) {
    for (const torch::Tensor& weight :
         {torch::randn({64, 128}) * 0.02, torch::randn({37, 75}) * 0.02,
          torch::randn({300, 41}).t() * 0.02, tied, torch::randn({1})}) {
      for (const int64_t blocksize : {64, 128}) {
        for (const bool double_quant : {false, true}) {
          const torch::Tensor typed = weight.to(dtype);
          const std::string what = std::string(torch::toString(dtype)) + " numel " +
                                   std::to_string(weight.numel()) + " blocksize " +
                                   std::to_string(blocksize) + (double_quant ? " double" : "");
          Nf4Weight fast = QuantizeNf4(typed, double_quant, blocksize);
          Nf4Weight aten = internal::QuantizeNf4Aten(typed, double_quant, blocksize);
          ExpectSameBits(fast.packed, aten.packed, what + " packed");
          if (double_quant) {
            ExpectSameBits(fast.quantized_absmax, aten.quantized_absmax,
                           what + " quantized absmax");
            ExpectSameBits(fast.nested_absmax, aten.nested_absmax, what + " nested absmax");
            ExpectSameBits(fast.offset, aten.offset, what + " offset");
          } else {
            ExpectSameBits(fast.absmax, aten.absmax, what + " absmax");
          }
        }
      }
    }
  }
}

// The NF4 offset is summed in one fixed order (ATen's single-threaded mean with 8-float vectors, as
// bitsandbytes gets it on an AVX2 CPU), so its bits depend neither on the CPU nor on the thread
// count, even from 32768 blocks, where ATen's own mean splits the sum between threads.
TEST(Nf4Test, OffsetHasTheSameBitsForAnyThreadCount) {
  torch::manual_seed(9);
  const int threads = at::get_num_threads();
  const std::string capability = at::get_cpu_capability();
#if defined(__x86_64__)
  // x86's default build has 8-float vectors too; AVX-512 has 16, and sums in another order.
  const bool aten_sums_in_8_lanes = capability == "AVX2" || capability == "DEFAULT";
#else
  const bool aten_sums_in_8_lanes = capability == "AVX2";
#endif
  // Blocks of 64: 1 and 3 (fewer than 8 values), 1001 (the last short) and 35200 (ATen splits that
  // sum between threads).
  for (const int64_t n :
       {int64_t{40}, int64_t{3 * 64}, int64_t{1000 * 64 + 17}, 35200 * int64_t{64}}) {
    const torch::Tensor weight = torch::randn({n}) * 0.02;
    at::set_num_threads(1);
    const torch::Tensor one = QuantizeNf4(weight, /*double_quant=*/true).offset;
    const torch::Tensor aten_one = QuantizeNf4(weight, /*double_quant=*/false).absmax.mean();
    at::set_num_threads(2);
    const torch::Tensor two = QuantizeNf4(weight, /*double_quant=*/true).offset;
    const torch::Tensor aten_two = QuantizeNf4(weight, /*double_quant=*/false).absmax.mean();
    at::set_num_threads(threads);
    const std::string what = "numel " + std::to_string(n);
    std::printf("%s: ATen's mean with 2 threads %s the one with 1\n", what.c_str(),
                torch::equal(aten_two, aten_one) ? "equals" : "differs from");
    ExpectSameBits(two, one, what + " offset, 2 threads against 1");
    if (aten_sums_in_8_lanes) ExpectSameBits(one, aten_one, what + " offset against ATen's mean");
  }
}

// Quantising allocates its outputs and nothing the size of the input.
TEST(Nf4Test, CpuQuantisationAllocatesOnlyItsOutputs) {
  CountingCpuAllocator& allocator = CountingCpuAllocator::Install();
  const torch::Tensor weight = (torch::randn({1024, 1024}) * 0.02).to(torch::kBFloat16);
  const uint64_t before = allocator.device().allocated_bytes;
  allocator.ResetPeaks();
  Nf4Weight w = QuantizeNf4(weight, /*double_quant=*/true);
  const uint64_t peak = allocator.device().peak_bytes - before;
  std::printf("NF4 1024x1024 bf16: peak %llu bytes while quantising, %lld bytes stored\n",
              static_cast<unsigned long long>(peak), static_cast<long long>(w.bytes()));
  EXPECT_LT(peak, static_cast<uint64_t>(w.bytes()) + weight.nbytes() / 4);
}

// Off the CPU, DequantizeNf4 gathers from a code table on the weight's own device, copied there
// once rather than in every pass. The meta device stands in for a GPU.
TEST(Nf4Test, PairTableIsOnTheAskedDeviceAndCopiedOnce) {
  const torch::Tensor& cpu = internal::Nf4PairTable(torch::kCPU);
  ASSERT_TRUE(cpu.device().is_cpu());
  const torch::Tensor codes = Nf4CodeTable();
  EXPECT_TRUE(torch::equal(cpu[0x1F], torch::stack({codes[1], codes[15]})));  // high nibble first
  const torch::Tensor& meta = internal::Nf4PairTable(torch::kMeta);
  EXPECT_TRUE(meta.is_meta());
  EXPECT_EQ(meta.sizes(), cpu.sizes());
  EXPECT_TRUE(internal::Nf4PairTable(torch::kMeta).is_same(meta));
  EXPECT_TRUE(internal::Nf4PairTable(torch::kCPU).is_same(cpu));
}

TEST(Nf4LinearTest, ForwardAndInputGradientMatchTheDensePath) {
  torch::manual_seed(1);
  Nf4Weight w = QuantizeNf4(torch::randn({48, 128}) * 0.05, /*double_quant=*/true);
  for (const torch::ScalarType dtype : {torch::kFloat32, torch::kBFloat16}) {
    const torch::Tensor x0 = torch::randn({3, 5, 128});
    const torch::Tensor upstream = torch::randn({3, 5, 48}).to(dtype);
    torch::Tensor x = x0.clone().requires_grad_(true);
    torch::Tensor y = Nf4Linear(x, w, dtype);  // (3, 5, 48)
    ASSERT_EQ(y.sizes(), (std::vector<int64_t>{3, 5, 48}));
    ASSERT_EQ(y.scalar_type(), dtype);
    y.backward(upstream);

    torch::Tensor x_dense = x0.clone().requires_grad_(true);
    torch::Tensor y_dense = torch::matmul(x_dense.to(dtype), DequantizeNf4(w, dtype).t());
    y_dense.backward(upstream);
    EXPECT_TRUE(torch::equal(y, y_dense)) << torch::toString(dtype);
    EXPECT_TRUE(torch::allclose(x.grad(), x_dense.grad(), 1e-5, 1e-6)) << torch::toString(dtype);
    EXPECT_EQ(x.grad().scalar_type(), torch::kFloat32);
  }
}

// With the graph alive after forward, only the output is new memory: the dense weight is freed when
// forward returns and rebuilt in backward.
TEST(Nf4LinearTest, KeepsNoDenseWeightBetweenForwardAndBackward) {
  CountingCpuAllocator& allocator = CountingCpuAllocator::Install();
  torch::manual_seed(2);
  Nf4Weight w = QuantizeNf4(torch::randn({1024, 1024}) * 0.05, /*double_quant=*/true);
  DequantizeNf4(w, torch::kFloat32);  // builds the cached code tables outside the measurement
  torch::Tensor x = torch::randn({4, 1024}).requires_grad_(true);
  const uint64_t dense_bytes = 1024 * 1024 * sizeof(float);

  const uint64_t before = allocator.device().allocated_bytes;
  allocator.ResetPeaks();
  torch::Tensor y = Nf4Linear(x, w, torch::kFloat32);  // (4, 1024)
  const uint64_t after_forward = allocator.device().allocated_bytes - before;
  EXPECT_GE(allocator.device().peak_bytes - before, dense_bytes);  // it was materialised, briefly
  EXPECT_LT(after_forward, dense_bytes + y.nbytes());
  EXPECT_LT(after_forward, dense_bytes / 16);
  std::printf("after forward, graph alive: %llu bytes (dense weight %llu)\n",
              static_cast<unsigned long long>(after_forward),
              static_cast<unsigned long long>(dense_bytes));
  y.sum().backward();
  ASSERT_TRUE(x.grad().defined());
  EXPECT_EQ(x.grad().sizes(), x.sizes());
}

}  // namespace
}  // namespace llmctl::trainer
