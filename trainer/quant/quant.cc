#include "trainer/quant/quant.h"

#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <array>
#include <cmath>

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

// Built once: DequantizeNf4 runs in every forward and backward.
const torch::Tensor& SignedMapOnCpu() {
  static const torch::Tensor map = DynamicMap(/*is_signed=*/true);
  return map;
}

// The fp32 per-block absmax of an NF4 weight, undoing double quantisation when present.
torch::Tensor Nf4Absmax(const Nf4Weight& w) {
  if (!w.double_quant) return w.absmax;
  const torch::Tensor code = SignedMapOnCpu().to(w.quantized_absmax.device());
  return DequantizeBlockwise8bit({w.quantized_absmax, w.nested_absmax, kNestedBlocksize}, code)
      .add_(w.offset);
}

// Byte b -> (code[b >> 4], code[b & 15]): one gather per byte instead of unpacking nibbles first.
const torch::Tensor& Nf4PairTableOnCpu() {
  static const torch::Tensor pairs = [] {
    torch::Tensor bytes = torch::arange(256, torch::TensorOptions().dtype(torch::kInt32));
    torch::Tensor table = Nf4CodeTable();
    return torch::stack({table.index_select(0, bytes.bitwise_right_shift(4)),
                         table.index_select(0, bytes.bitwise_and(15))},
                        1);
  }();
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

// Saved in the autograd context instead of the dense weight: the backward dequantises again.
void SaveNf4(torch::autograd::AutogradContext* ctx, const Nf4Weight& w) {
  ctx->saved_data["shape"] = w.shape;
  ctx->saved_data["blocksize"] = w.blocksize;
  ctx->saved_data["packed"] = w.packed;
  ctx->saved_data["absmax"] = w.absmax;
  ctx->saved_data["quantized_absmax"] = w.quantized_absmax;
  ctx->saved_data["nested_absmax"] = w.nested_absmax;
  ctx->saved_data["offset"] = w.offset;
  ctx->saved_data["double_quant"] = w.double_quant;
}

Nf4Weight LoadNf4(torch::autograd::AutogradContext* ctx) {
  Nf4Weight w;
  w.shape = ctx->saved_data["shape"].toIntVector();
  w.blocksize = ctx->saved_data["blocksize"].toInt();
  w.packed = ctx->saved_data["packed"].toTensor();
  w.absmax = ctx->saved_data["absmax"].toTensor();
  w.quantized_absmax = ctx->saved_data["quantized_absmax"].toTensor();
  w.nested_absmax = ctx->saved_data["nested_absmax"].toTensor();
  w.offset = ctx->saved_data["offset"].toTensor();
  w.double_quant = ctx->saved_data["double_quant"].toBool();
  return w;
}

class Nf4LinearFunction : public torch::autograd::Function<Nf4LinearFunction> {
 public:
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& x,
                               const Nf4Weight& w, torch::ScalarType compute_dtype) {
    SaveNf4(ctx, w);
    ctx->saved_data["compute_dtype"] = static_cast<int64_t>(compute_dtype);
    ctx->saved_data["input_dtype"] = static_cast<int64_t>(x.scalar_type());
    // (out, in), freed when forward returns: only the packed weight is kept for backward.
    torch::Tensor weight = DequantizeNf4(w, compute_dtype);
    return torch::matmul(x.to(compute_dtype), weight.t());  // (..., out)
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grad_outputs) {
    const auto compute_dtype =
        static_cast<torch::ScalarType>(ctx->saved_data["compute_dtype"].toInt());
    const auto input_dtype = static_cast<torch::ScalarType>(ctx->saved_data["input_dtype"].toInt());
    torch::Tensor weight = DequantizeNf4(LoadNf4(ctx), compute_dtype);  // (out, in)
    // (..., out) @ (out, in) -> (..., in)
    torch::Tensor grad_x = torch::matmul(grad_outputs[0].to(compute_dtype), weight).to(input_dtype);
    return {grad_x, torch::Tensor(), torch::Tensor()};
  }
};

}  // namespace

torch::Tensor DynamicMap(bool is_signed) {
  // create_dynamic_map(signed, max_exponent_bits=7, total_bits=8): for exponent i, 2^i (signed) or
  // 2^(i+1) (unsigned) linearly spaced fractions in (0.1, 1) scaled by 10^(i-6), mirrored for the
  // sign, plus 0 and 1. The arithmetic is fp32 ATen, as in bitsandbytes, so the codes match to the
  // bit.
  constexpr int kMaxExponentBits = 7;
  std::vector<torch::Tensor> parts;
  for (int i = 0; i < kMaxExponentBits; ++i) {
    const int64_t fraction_items = is_signed ? (int64_t{1} << i) + 1 : (int64_t{1} << (i + 1)) + 1;
    torch::Tensor boundaries = torch::linspace(0.1, 1, fraction_items, torch::kFloat32);
    torch::Tensor means = (boundaries.slice(0, 0, -1) + boundaries.slice(0, 1)) / 2.0;
    const double scale = std::pow(10.0, -(kMaxExponentBits - 1) + i);
    parts.push_back(means * scale);
    if (is_signed) parts.push_back(means * -scale);
  }
  parts.push_back(torch::tensor({0.0f, 1.0f}));
  torch::Tensor code = std::get<0>(torch::cat(parts).sort());
  TORCH_CHECK(code.numel() == 256, "dynamic map has ", code.numel(), " codes");
  return code;
}

Blockwise8bit QuantizeBlockwise8bit(const torch::Tensor& x, const torch::Tensor& code_map,
                                    int64_t blocksize) {
  TORCH_CHECK(code_map.numel() == 256 && code_map.scalar_type() == torch::kFloat32,
              "code map must be 256 fp32 codes");
  BlockScaled s = ScaleByBlockAbsmax(Flat32(x), blocksize);
  return {NearestCode(s.scaled, code_map).view(x.sizes()), s.absmax, blocksize};
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
  TORCH_CHECK(weight.is_floating_point(), "NF4 quantises float weights, got ",
              weight.scalar_type());
  Nf4Weight w;
  w.shape = weight.sizes().vec();
  w.blocksize = blocksize;
  w.double_quant = double_quant;
  BlockScaled s = ScaleByBlockAbsmax(Flat32(weight), blocksize);
  // An odd count gets a zero in the last low nibble, as bitsandbytes pads it.
  if (s.scaled.numel() % 2 != 0) s.scaled = torch::constant_pad_nd(s.scaled, {0, 1});
  torch::Tensor codes = NearestCode(s.scaled, Nf4CodeTable().to(weight.device())).view({-1, 2});
  w.packed = codes.select(1, 0).bitwise_left_shift(4).bitwise_or_(codes.select(1, 1));
  if (!double_quant) {
    w.absmax = s.absmax;
    return w;
  }
  w.offset = s.absmax.mean();
  Blockwise8bit nested = QuantizeBlockwise8bit(
      s.absmax - w.offset, DynamicMap(/*is_signed=*/true).to(weight.device()), kNestedBlocksize);
  w.quantized_absmax = nested.codes;
  w.nested_absmax = nested.absmax;
  return w;
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
  torch::Tensor values = Nf4PairTableOnCpu()
                             .to(w.packed.device())
                             .index_select(0, w.packed.to(torch::kInt32))  // (bytes, 2)
                             .view(-1)
                             .slice(0, 0, n);
  return ScaleBlocks(values, Nf4Absmax(w), w.blocksize).to(dtype).view(w.shape);
}

torch::Tensor Nf4Linear(const torch::Tensor& x, const Nf4Weight& w,
                        torch::ScalarType compute_dtype) {
  TORCH_CHECK(w.shape.size() == 2 && x.size(-1) == w.shape[1], "Nf4Linear: input (..., ",
              x.size(-1), ") does not match the weight's in-features");
  return Nf4LinearFunction::apply(x, w, compute_dtype);
}

}  // namespace llmctl::trainer
