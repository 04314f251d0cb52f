// bitsandbytes-compatible quantisation: the 8-bit dynamic code maps and blockwise 8-bit
// quantisation (8-bit optimizer state), and NF4 weights as bitsandbytes' Linear4bit stores them
// (QLoRA), with a linear layer that dequantises them on the fly.
//
// Every function reproduces bitsandbytes 0.50 bit for bit (tests/fixtures/quant, written by
// scripts/fixtures/make_bnb_fixtures.py). "Nearest code" is exact: bitsandbytes' CUDA and
// pure-PyTorch kernels pick the nearest code (a value on a midpoint goes to the lower code); its
// native CPU kernel is an approximation that misplaces ~0.15% of values, and is not what is matched
// here.
//
// Implemented with device-generic ATen ops, so weights and optimizer state can live on CPU or CUDA;
// CPU tensors take one-pass loops, parallel over blocks, with the same fp32 arithmetic (the same
// bits) and no temporaries the size of the input.
// On CPU the results are the same bits whatever vector unit ATen dispatches to (default, AVX2,
// AVX-512; ATEN_CPU_CAPABILITY) and whatever the thread count: the two results whose ATen rounding
// varies with those, the dynamic map's linspace and the NF4 offset's mean, are computed in scalar
// code in the order ATen's AVX2 build uses, which is what bitsandbytes gives on an AVX2 CPU. On
// CUDA the offset is ATen's mean, whose rounding may differ from the CPU's.
// Argument errors are programming errors and throw c10::Error (TORCH_CHECK).
#ifndef LLMCTL_TRAINER_QUANT_QUANT_H_
#define LLMCTL_TRAINER_QUANT_QUANT_H_

#include <torch/torch.h>

#include <cstdint>
#include <vector>

namespace llmctl::trainer {

// bitsandbytes' create_dynamic_map(signed=is_signed, max_exponent_bits=7, total_bits=8): 256
// float32 codes in ascending order, spanning [-1, 1] (signed) or [0, 1] (unsigned). On CPU. The
// codes bitsandbytes builds with torch on an AVX2 CPU (its linspace fuses multiply-adds there), on
// every CPU.
torch::Tensor DynamicMap(bool is_signed);

// Blockwise 8-bit quantisation against a sorted 256-entry code map (bitsandbytes
// quantize_blockwise).
struct Blockwise8bit {
  torch::Tensor codes;   // uint8, the input's shape
  torch::Tensor absmax;  // fp32 (ceil(numel / blocksize))
  int64_t blocksize = 256;
};

// Per block of `blocksize` consecutive elements (the last may be short): the fp32 absmax, then each
// x / absmax mapped to the nearest code. `x` may have any float dtype; `code_map` must be on x's
// device.
Blockwise8bit QuantizeBlockwise8bit(const torch::Tensor& x, const torch::Tensor& code_map,
                                    int64_t blocksize);
// code_map[codes] * absmax of the block, fp32, flat (numel).
torch::Tensor DequantizeBlockwise8bit(const Blockwise8bit& q, const torch::Tensor& code_map);

// An NF4 weight as bitsandbytes' Linear4bit holds it: blockwise absmax scaling and the 16-value NF4
// table, two codes per byte, the first element in the high nibble. With double quantisation the
// per-block absmax is itself quantised: offset = mean(absmax), and absmax - offset is quantised
// blockwise (256) with the signed dynamic map.
struct Nf4Weight {
  std::vector<int64_t> shape;  // the original weight's shape, e.g. (out, in)
  int64_t blocksize = 64;
  torch::Tensor packed;            // uint8 (ceil(numel / 2))
  torch::Tensor absmax;            // fp32 (blocks); only without double quantisation
  torch::Tensor quantized_absmax;  // uint8 (blocks); only with double quantisation
  torch::Tensor nested_absmax;     // fp32 (ceil(blocks / 256)); only with double quantisation
  // fp32 scalar (0-dim): the mean of the fp32 absmax; only with double quantisation. A tensor, not
  // a float, so it lives on the weight's device and moves, saves and loads with the other tensors.
  // Quantised on CPU, summed in the fixed order of torch's single-threaded AVX2 mean (what
  // bitsandbytes gets on such a CPU), so it has the same bits on every CPU and thread count.
  torch::Tensor offset;
  bool double_quant = true;

  int64_t numel() const;
  // Every tensor it holds, so memory accounting counts them as parameter bytes.
  std::vector<torch::Tensor> StorageTensors() const;
  // Bytes of StorageTensors().
  int64_t bytes() const;
};

// The NF4 code table, index 0 -> 15 (fp32, on CPU).
torch::Tensor Nf4CodeTable();

// bitsandbytes quantize_4bit(quant_type="nf4", blocksize, compress_statistics=double_quant).
// `weight` may have any float dtype and device; the result lives on the same device.
Nf4Weight QuantizeNf4(const torch::Tensor& weight, bool double_quant, int64_t blocksize = 64);
// An Nf4Weight for a weight of `shape` with its tensors allocated on `device` but not filled: a
// module registers them before the values exist, and CopyNf4 fills them from QuantizeNf4's result.
Nf4Weight EmptyNf4(const std::vector<int64_t>& shape, bool double_quant, torch::Device device,
                   int64_t blocksize = 64);
// Copies `from`'s tensors into `to`'s (same shape, blocksize and double_quant), in place.
void CopyNf4(const Nf4Weight& from, Nf4Weight& to);
// bitsandbytes dequantize_4bit: code * absmax in fp32, then rounded to `dtype`; the original shape.
torch::Tensor DequantizeNf4(const Nf4Weight& w, torch::ScalarType dtype);

// y = x W^T for an NF4 W, in `compute_dtype`. W is dequantised in forward and again in backward, so
// the dense weight never outlives either pass; W gets no gradient (it is frozen, as in QLoRA), x
// does. x (..., in) -> y (..., out).
torch::Tensor Nf4Linear(const torch::Tensor& x, const Nf4Weight& w,
                        torch::ScalarType compute_dtype);

namespace internal {

// The device-generic ATen implementations, which non-CPU tensors take. The CPU fast paths of
// QuantizeBlockwise8bit and QuantizeNf4 give the same bits; tests check them against these.
Blockwise8bit QuantizeBlockwise8bitAten(const torch::Tensor& x, const torch::Tensor& code_map,
                                        int64_t blocksize);
Nf4Weight QuantizeNf4Aten(const torch::Tensor& weight, bool double_quant, int64_t blocksize);

// The (256, 2) fp32 table of each packed byte's two NF4 codes (high nibble first) that
// DequantizeNf4 gathers from off the CPU, on `device`: the one host table on CPU, elsewhere a copy
// made on first use and kept, one per device, so that dequantising in every pass copies nothing
// from the host.
const torch::Tensor& Nf4PairTable(torch::Device device);

}  // namespace internal

}  // namespace llmctl::trainer

#endif  // LLMCTL_TRAINER_QUANT_QUANT_H_
