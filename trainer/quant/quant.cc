#include "trainer/quant/quant.h"

#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <memory>
#include <mutex>
#include <unordered_map>
#include <utility>
#include <vector>

#include "trainer/memory/counting_allocator.h"
#include "trainer/quant/aten_rounding.h"
#include "trainer/quant/quant_cpu.h"

namespace llmctl::trainer {
namespace {

constexpr std::array<float, 16> kNf4Codes = {-1.0f,
                                             -0.6961928009986877f,
                                             -0.5250730514526367f,
                                             -0.39491748809814453f,
                                             -0.28444138169288635f,
                                             -0.18477343022823334f,
                                             -0.09105003625154495f,
                                             0.0f,
                                             0.07958029955625534f,
                                             0.16093020141124725f,
                                             0.24611230194568634f,
                                             0.33791524171829224f,
                                             0.44070982933044434f,
                                             0.5626170039176941f,
                                             0.7229568362236023f,
                                             1.0f};

// bitsandbytes' fixed block size for quantising the NF4 absmax (double quantisation).
constexpr int64_t kNestedBlocksize = 256;

torch::Tensor Flat32(const torch::Tensor& x) { return x.reshape(-1).to(torch::kFloat32); }

struct BlockScaled {
  torch::Tensor scaled;  // fp32 (n), in [-1, 1]
  torch::Tensor absmax;  // fp32 (blocks)
};

// x / absmax of its block, exactly as bitsandbytes' quantisation kernels round it: full blocks are
// multiplied by the reciprocal of their absmax (clamped to 1e-38 so an all-zero block gives 0, not
// NaN), a short tail block is divided by its clamped absmax, which is also what gets stored for it.
BlockScaled ScaleByBlockAbsmax(const torch::Tensor& flat, int64_t blocksize) {
  TORCH_CHECK(blocksize > 0, "blocksize must be positive, got ", blocksize);
  const int64_t n = flat.numel();
  const int64_t tail = n % blocksize;
  const int64_t full = n - tail;
  torch::Tensor body = flat.slice(0, 0, full).view({full / blocksize, blocksize});
  torch::Tensor absmax = body.abs().amax(1);
  torch::Tensor scaled =
      (body * absmax.clamp_min(1e-38).reciprocal().unsqueeze(1)).clamp_(-1, 1).view(-1);
  if (tail != 0) {
    torch::Tensor rest = flat.slice(0, full);
    torch::Tensor rest_absmax = rest.abs().max().clamp_min(1e-38);
    absmax = torch::cat({absmax, rest_absmax.unsqueeze(0)});
    scaled = torch::cat({scaled, (rest / rest_absmax).clamp_(-1, 1)});
  }
  return {scaled, absmax};
}

// Index of the nearest code for each value of `scaled`, given a sorted code table: a binary search
// on the midpoints between neighbouring codes; a value exactly on a midpoint goes to the lower
// code.
torch::Tensor NearestCode(const torch::Tensor& scaled, const torch::Tensor& code) {
  torch::Tensor midpoints = (code.slice(0, 0, -1) + code.slice(0, 1)) / 2.0;
  return torch::bucketize(scaled, midpoints, /*out_int32=*/true, /*right=*/false).to(torch::kUInt8);
}

// values[i] * absmax[i / blocksize], fp32; values (n) fp32.
torch::Tensor ScaleBlocks(const torch::Tensor& values, const torch::Tensor& absmax,
                          int64_t blocksize) {
  const int64_t n = values.numel();
  const int64_t full = n - n % blocksize;
  const int64_t blocks = full / blocksize;
  torch::Tensor out = torch::empty_like(values);
  torch::Tensor body = out.slice(0, 0, full).view({blocks, blocksize});  // (blocks, blocksize)
  torch::mul_out(body, values.slice(0, 0, full).view({blocks, blocksize}),
                 absmax.slice(0, 0, blocks).unsqueeze(1));
  if (full != n) {
    torch::Tensor tail = out.slice(0, full);
    torch::mul_out(tail, values.slice(0, full), absmax[blocks]);
  }
  return out;
}

// The double-quantisation offset, mean(absmax), as a 0-dim fp32 tensor on absmax's device. On CUDA
// it stays ATen's mean: GPU results are not compared with the CPU-made fixtures, and copying the
// absmax to the host for a fixed order would cost a synchronisation per weight.
torch::Tensor Nf4Offset(const torch::Tensor& absmax) {
  if (!absmax.is_cpu()) return absmax.mean();
  const torch::Tensor values = absmax.contiguous();
  return torch::scalar_tensor(
      aten_rounding::MeanInAten8LaneOrder(values.data_ptr<float>(), values.numel()),
      torch::TensorOptions().dtype(torch::kFloat32));
}

// Tables the process builds once and keeps for its life are host memory, as they are beside a GPU:
// a run's device figures then do not depend on whether an earlier run in the process (llm-train
// --runs) built them.
template <typename Build>
torch::Tensor HostTable(Build build) {
  ScopedHostAllocations host;
  return build();
}

// Built once: DequantizeNf4 runs in every forward and backward, the optimizer in every step.
const torch::Tensor& DynamicMapOnCpu(bool is_signed) {
  static const torch::Tensor signed_map = HostTable([] { return DynamicMap(/*is_signed=*/true); });
  static const torch::Tensor unsigned_map =
      HostTable([] { return DynamicMap(/*is_signed=*/false); });
  return is_signed ? signed_map : unsigned_map;
}

// One of this file's host tables on any device: the table itself on CPU; elsewhere a copy made on
// the first call for that device and kept for the process's life (leaked, so no CUDA tensor is
// freed after the CUDA runtime has gone at exit). DequantizeNf4 runs in every forward and backward,
// which on a GPU would otherwise copy each table from pageable host memory, a synchronising copy,
// per layer and pass. A copy is a few kilobytes of device memory that outlive the run that made it,
// as cuBLAS's workspaces do.
class PerDeviceTable {
 public:
  explicit PerDeviceTable(const torch::Tensor& host) : host_(host) {}

  const torch::Tensor& On(torch::Device device) {
    if (device.is_cpu()) return host_;
    std::lock_guard<std::mutex> lock(mutex_);
    if (auto it = copies_.find(device); it != copies_.end()) return it->second;
    return copies_.emplace(device, host_.to(device)).first->second;
  }

 private:
  const torch::Tensor host_;
  std::mutex mutex_;
  std::unordered_map<torch::Device, torch::Tensor> copies_;  // node-based: references stay valid
};

const torch::Tensor& SignedDynamicMapOn(torch::Device device) {
  static auto* const tables = new PerDeviceTable(DynamicMapOnCpu(/*is_signed=*/true));
  return tables->On(device);
}

// The fp32 per-block absmax of an NF4 weight, undoing double quantisation when present.
torch::Tensor Nf4Absmax(const Nf4Weight& w) {
  if (!w.double_quant) return w.absmax;
  const torch::Tensor& code = SignedDynamicMapOn(w.quantized_absmax.device());
  return DequantizeBlockwise8bit({w.quantized_absmax, w.nested_absmax, kNestedBlocksize}, code)
      .add_(w.offset);
}

// Byte b -> (code[b >> 4], code[b & 15]): one gather per byte instead of unpacking nibbles first.
const torch::Tensor& Nf4PairTableOnCpu() {
  static const torch::Tensor pairs = HostTable([] {
    torch::Tensor bytes = torch::arange(256, torch::TensorOptions().dtype(torch::kInt32));
    torch::Tensor table = Nf4CodeTable();
    return torch::stack({table.index_select(0, bytes.bitwise_right_shift(4)),
                         table.index_select(0, bytes.bitwise_and(15))},
                        1);
  });
  return pairs;  // (256, 2)
}

// DequantizeNf4 on CPU in one pass over the packed bytes (the ATen path takes four), in parallel
// over blocks; the same fp32 product and rounding to T as the ATen path, so the same bits.
template <typename T>
void DequantizeNf4Cpu(const uint8_t* packed, const float* absmax, int64_t n, int64_t blocksize,
                      T* out) {
  const int64_t blocks = (n + blocksize - 1) / blocksize;
  at::parallel_for(0, blocks, /*grain_size=*/64, [&](int64_t begin, int64_t end) {
    for (int64_t b = begin; b < end; ++b) {
      const float scale = absmax[b];
      const int64_t last = std::min(n, (b + 1) * blocksize);
      for (int64_t i = b * blocksize; i < last; ++i) {
        const uint8_t byte = packed[i >> 1];
        out[i] = static_cast<T>(kNf4Codes[(i & 1) != 0 ? byte & 15 : byte >> 4] * scale);
      }
    }
  });
}

// Blocks per parallel_for task: about 16K elements, so tasks outweigh their scheduling.
int64_t GrainBlocks(int64_t blocksize) { return std::max<int64_t>(1, 16384 / blocksize); }

// QuantizeBlockwise8bit on CPU in one pass over x, in parallel over blocks, without temporaries.
template <typename T>
void QuantizeBlockwise8bitCpu(const T* x, int64_t n, const quant_cpu::NearestCode<256>& nearest,
                              int64_t blocksize, uint8_t* codes, float* absmax) {
  const int64_t blocks = (n + blocksize - 1) / blocksize;
  at::parallel_for(0, blocks, GrainBlocks(blocksize), [&](int64_t begin, int64_t end) {
    for (int64_t b = begin; b < end; ++b) {
      const int64_t start = b * blocksize;
      const int64_t len = std::min(blocksize, n - start);
      uint8_t* out = codes + start;
      absmax[b] = quant_cpu::QuantizeBlock(x + start, len, len == blocksize, nearest,
                                           [out](int64_t i, uint8_t code) { out[i] = code; });
    }
  });
}

// The NF4 codes and absmax on CPU in one pass over the weight, in parallel over blocks. `blocksize`
// is even, so no byte straddles two blocks (two tasks never write one byte).
template <typename T>
void PackNf4Cpu(const T* x, int64_t n, int64_t blocksize, uint8_t* packed, float* absmax) {
  static const auto* const nearest_nf4 = new quant_cpu::NearestCode<16>(kNf4Codes.data());
  const quant_cpu::NearestCode<16>& nearest = *nearest_nf4;
  // An odd count gets the code of 0 in the last low nibble, as the ATen path pads the scaled
  // values.
  const uint8_t pad = nearest(0.0f);
  const int64_t blocks = (n + blocksize - 1) / blocksize;
  at::parallel_for(0, blocks, GrainBlocks(blocksize), [&](int64_t begin, int64_t end) {
    for (int64_t b = begin; b < end; ++b) {
      const int64_t start = b * blocksize;
      const int64_t len = std::min(blocksize, n - start);
      uint8_t* out = packed + start / 2;
      absmax[b] = quant_cpu::QuantizeBlock(x + start, len, len == blocksize, nearest,
                                           [out](int64_t i, uint8_t code) {
                                             if ((i & 1) == 0) {
                                               out[i >> 1] = static_cast<uint8_t>(code << 4);
                                             } else {
                                               out[i >> 1] |= code;
                                             }
                                           });
      if (len % 2 != 0) out[len >> 1] |= pad;
    }
  });
}

struct PackedNf4 {
  torch::Tensor packed;  // uint8 (ceil(n / 2))
  torch::Tensor absmax;  // fp32 (blocks)
};

PackedNf4 PackNf4OnCpu(const torch::Tensor& weight, int64_t blocksize) {
  const torch::Tensor x = weight.contiguous();
  const int64_t n = x.numel();
  PackedNf4 out{torch::empty({(n + 1) / 2}, torch::TensorOptions().dtype(torch::kUInt8)),
                torch::empty({(n + blocksize - 1) / blocksize},
                             torch::TensorOptions().dtype(torch::kFloat32))};
  AT_DISPATCH_FLOATING_TYPES_AND2(
      torch::kBFloat16, torch::kHalf, x.scalar_type(), "QuantizeNf4", [&] {
        PackNf4Cpu(x.data_ptr<scalar_t>(), n, blocksize, out.packed.data_ptr<uint8_t>(),
                   out.absmax.data_ptr<float>());
      });
  return out;
}

PackedNf4 PackNf4WithAten(const torch::Tensor& weight, int64_t blocksize) {
  BlockScaled s = ScaleByBlockAbsmax(Flat32(weight), blocksize);
  // An odd count gets a zero in the last low nibble, as bitsandbytes pads it.
  if (s.scaled.numel() % 2 != 0) s.scaled = torch::constant_pad_nd(s.scaled, {0, 1});
  torch::Tensor codes = NearestCode(s.scaled, Nf4CodeTable().to(weight.device())).view({-1, 2});
  return {codes.select(1, 0).bitwise_left_shift(4).bitwise_or_(codes.select(1, 1)), s.absmax};
}

// The Nf4Weight of packed codes and their absmax, double quantising the absmax if asked (with
// QuantizeBlockwise8bit, or its ATen reference when `aten`).
Nf4Weight MakeNf4Weight(const torch::Tensor& weight, PackedNf4 packed, bool double_quant,
                        int64_t blocksize, bool aten) {
  Nf4Weight w;
  w.shape = weight.sizes().vec();
  w.blocksize = blocksize;
  w.double_quant = double_quant;
  w.packed = std::move(packed.packed);
  if (!double_quant) {
    w.absmax = std::move(packed.absmax);
    return w;
  }
  const torch::Tensor offset = Nf4Offset(packed.absmax);
  w.offset = offset;  // 0-dim fp32, so it moves and is saved with the other buffers
  const torch::Tensor centred = packed.absmax - offset;
  const torch::Tensor& code = SignedDynamicMapOn(weight.device());
  Blockwise8bit nested = aten ? internal::QuantizeBlockwise8bitAten(centred, code, kNestedBlocksize)
                              : QuantizeBlockwise8bit(centred, code, kNestedBlocksize);
  w.quantized_absmax = nested.codes;
  w.nested_absmax = nested.absmax;
  return w;
}

void CheckNf4Arguments(const torch::Tensor& weight, int64_t blocksize) {
  TORCH_CHECK(weight.is_floating_point(), "NF4 quantises float weights, got ",
              weight.scalar_type());
  TORCH_CHECK(blocksize > 0, "blocksize must be positive, got ", blocksize);
}

// The nearest-code search for a contiguous CPU `code_map`: the shared one for a dynamic map, else
// one built into `storage`.
const quant_cpu::NearestCode<256>& NearestFor(
    const torch::Tensor& code_map, std::unique_ptr<quant_cpu::NearestCode<256>>& storage) {
  for (const bool is_signed : {true, false}) {
    if (torch::equal(code_map, DynamicMapOnCpu(is_signed))) {
      return quant_cpu::DynamicMapNearest(is_signed);
    }
  }
  storage = std::make_unique<quant_cpu::NearestCode<256>>(code_map.data_ptr<float>());
  return *storage;
}

void CheckCodeMap(const torch::Tensor& code_map) {
  TORCH_CHECK(code_map.numel() == 256 && code_map.scalar_type() == torch::kFloat32,
              "code map must be 256 fp32 codes");
}

}  // namespace

namespace quant_cpu {

const NearestCode<256>& DynamicMapNearest(bool is_signed) {
  // Leaked on purpose: no destructor runs at exit.
  static const auto* const signed_nearest =
      new NearestCode<256>(DynamicMapOnCpu(/*is_signed=*/true).data_ptr<float>());
  static const auto* const unsigned_nearest =
      new NearestCode<256>(DynamicMapOnCpu(/*is_signed=*/false).data_ptr<float>());
  return is_signed ? *signed_nearest : *unsigned_nearest;
}

}  // namespace quant_cpu

torch::Tensor DynamicMap(bool is_signed) {
  // create_dynamic_map(signed, max_exponent_bits=7, total_bits=8): for exponent i, 2^i (signed) or
  // 2^(i+1) (unsigned) linearly spaced fractions in (0.1, 1) scaled by 10^(i-6), mirrored for the
  // sign, plus 0 and 1. The same fp32 operations as bitsandbytes' torch code, in scalar C++ so that
  // the codes do not depend on the CPU (see aten_rounding.h).
  constexpr int kMaxExponentBits = 7;
  std::vector<float> code;
  for (int i = 0; i < kMaxExponentBits; ++i) {
    const int64_t fraction_items = is_signed ? (int64_t{1} << i) + 1 : (int64_t{1} << (i + 1)) + 1;
    const std::vector<float> boundaries = aten_rounding::LinspaceAsAvx2(0.1f, 1.0f, fraction_items);
    // torch multiplies fp32 by a Python float scalar in fp32.
    const auto scale = static_cast<float>(std::pow(10.0, -(kMaxExponentBits - 1) + i));
    for (size_t k = 0; k + 1 < boundaries.size(); ++k) {
      const float mean = (boundaries[k] + boundaries[k + 1]) / 2.0f;
      code.push_back(mean * scale);
      if (is_signed) code.push_back(mean * -scale);
    }
  }
  code.push_back(0.0f);
  code.push_back(1.0f);
  std::sort(code.begin(), code.end());
  TORCH_CHECK(code.size() == 256, "dynamic map has ", code.size(), " codes");
  return torch::from_blob(code.data(), {256}, torch::kFloat32).clone();
}

Blockwise8bit QuantizeBlockwise8bit(const torch::Tensor& x, const torch::Tensor& code_map,
                                    int64_t blocksize) {
  if (!x.is_cpu() || !x.is_floating_point()) {
    return internal::QuantizeBlockwise8bitAten(x, code_map, blocksize);
  }
  CheckCodeMap(code_map);
  TORCH_CHECK(blocksize > 0, "blocksize must be positive, got ", blocksize);
  const torch::Tensor flat = x.contiguous();
  const torch::Tensor map = code_map.contiguous();
  const int64_t n = flat.numel();
  std::unique_ptr<quant_cpu::NearestCode<256>> storage;
  const quant_cpu::NearestCode<256>& nearest = NearestFor(map, storage);
  Blockwise8bit q{torch::empty(x.sizes(), torch::TensorOptions().dtype(torch::kUInt8)),
                  torch::empty({(n + blocksize - 1) / blocksize},
                               torch::TensorOptions().dtype(torch::kFloat32)),
                  blocksize};
  AT_DISPATCH_FLOATING_TYPES_AND2(
      torch::kBFloat16, torch::kHalf, flat.scalar_type(), "QuantizeBlockwise8bit", [&] {
        QuantizeBlockwise8bitCpu(flat.data_ptr<scalar_t>(), n, nearest, blocksize,
                                 q.codes.data_ptr<uint8_t>(), q.absmax.data_ptr<float>());
      });
  return q;
}

torch::Tensor DequantizeBlockwise8bit(const Blockwise8bit& q, const torch::Tensor& code_map) {
  torch::Tensor values = code_map.index_select(0, q.codes.reshape(-1).to(torch::kInt32));
  return ScaleBlocks(values, q.absmax, q.blocksize);
}

torch::Tensor Nf4CodeTable() {
  return torch::from_blob(const_cast<float*>(kNf4Codes.data()), {16}, torch::kFloat32).clone();
}

int64_t Nf4Weight::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

std::vector<torch::Tensor> Nf4Weight::StorageTensors() const {
  if (double_quant) return {packed, quantized_absmax, nested_absmax, offset};
  return {packed, absmax};
}

int64_t Nf4Weight::bytes() const {
  int64_t total = 0;
  for (const torch::Tensor& t : StorageTensors()) total += t.nbytes();
  return total;
}

Nf4Weight QuantizeNf4(const torch::Tensor& weight, bool double_quant, int64_t blocksize) {
  // Odd block sizes (bitsandbytes has none) share a byte between blocks: ATen only.
  if (!weight.is_cpu() || blocksize % 2 != 0) {
    return internal::QuantizeNf4Aten(weight, double_quant, blocksize);
  }
  CheckNf4Arguments(weight, blocksize);
  return MakeNf4Weight(weight, PackNf4OnCpu(weight, blocksize), double_quant, blocksize,
                       /*aten=*/false);
}

Nf4Weight EmptyNf4(const std::vector<int64_t>& shape, bool double_quant, torch::Device device,
                   int64_t blocksize) {
  Nf4Weight w;
  w.shape = shape;
  w.blocksize = blocksize;
  w.double_quant = double_quant;
  const int64_t n = w.numel();
  const int64_t blocks = (n + blocksize - 1) / blocksize;
  const auto bytes = torch::TensorOptions().dtype(torch::kUInt8).device(device);
  const auto floats = torch::TensorOptions().dtype(torch::kFloat32).device(device);
  w.packed = torch::empty({(n + 1) / 2}, bytes);
  if (!double_quant) {
    w.absmax = torch::empty({blocks}, floats);
    return w;
  }
  w.quantized_absmax = torch::empty({blocks}, bytes);
  w.nested_absmax = torch::empty({(blocks + kNestedBlocksize - 1) / kNestedBlocksize}, floats);
  w.offset = torch::empty({}, floats);
  return w;
}

void CopyNf4(const Nf4Weight& from, Nf4Weight& to) {
  TORCH_CHECK(from.shape == to.shape && from.blocksize == to.blocksize &&
                  from.double_quant == to.double_quant,
              "CopyNf4: the weights differ in shape, blocksize or double quantisation");
  torch::NoGradGuard no_grad;
  const std::vector<torch::Tensor> source = from.StorageTensors();
  std::vector<torch::Tensor> target = to.StorageTensors();
  for (size_t i = 0; i < source.size(); ++i) target[i].copy_(source[i]);
}

torch::Tensor DequantizeNf4(const Nf4Weight& w, torch::ScalarType dtype) {
  const int64_t n = w.numel();
  if (w.packed.is_cpu()) {
    const torch::Tensor absmax = Nf4Absmax(w).contiguous();
    const torch::Tensor packed = w.packed.contiguous();
    torch::Tensor out = torch::empty(w.shape, torch::TensorOptions().dtype(dtype));
    AT_DISPATCH_FLOATING_TYPES_AND2(torch::kBFloat16, torch::kHalf, dtype, "DequantizeNf4", [&] {
      DequantizeNf4Cpu(packed.data_ptr<uint8_t>(), absmax.data_ptr<float>(), n, w.blocksize,
                       out.data_ptr<scalar_t>());
    });
    return out;
  }
  torch::Tensor values = internal::Nf4PairTable(w.packed.device())
                             .index_select(0, w.packed.to(torch::kInt32))  // (bytes, 2)
                             .view(-1)
                             .slice(0, 0, n);
  return ScaleBlocks(values, Nf4Absmax(w), w.blocksize).to(dtype).view(w.shape);
}

namespace internal {

Blockwise8bit QuantizeBlockwise8bitAten(const torch::Tensor& x, const torch::Tensor& code_map,
                                        int64_t blocksize) {
  CheckCodeMap(code_map);
  BlockScaled s = ScaleByBlockAbsmax(Flat32(x), blocksize);
  return {NearestCode(s.scaled, code_map).view(x.sizes()), s.absmax, blocksize};
}

Nf4Weight QuantizeNf4Aten(const torch::Tensor& weight, bool double_quant, int64_t blocksize) {
  CheckNf4Arguments(weight, blocksize);
  return MakeNf4Weight(weight, PackNf4WithAten(weight, blocksize), double_quant, blocksize,
                       /*aten=*/true);
}

const torch::Tensor& Nf4PairTable(torch::Device device) {
  static auto* const tables = new PerDeviceTable(Nf4PairTableOnCpu());
  return tables->On(device);
}

}  // namespace internal

}  // namespace llmctl::trainer
