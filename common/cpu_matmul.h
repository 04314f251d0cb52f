// One rule the trainer and its tests share: on which CPUs LibTorch multiplies 16-bit matrices
// (bf16, fp16) faster than the trainer's fp32 route (trainer/kernels/linear.h).
//
// LibTorch's 16-bit CPU GEMM is oneDNN's. Native bf16 needs avx512_bf16 (oneDNN's
// AVX512_CORE_BF16, brgemm: Cooper Lake, Sapphire Rapids and later, Zen 4); fp16 needs
// avx512_fp16 (AVX512_CORE_FP16, or AMX-FP16, which comes with it). Elsewhere LibTorch has only
// slower paths: on AVX512_CORE without avx512_bf16 (Skylake, Cascade Lake and Ice Lake Xeons)
// oneDNN's gemm:jit:bf16 converts each bf16 value in its loop, 71-74 GFLOP/s against 163-194 for
// the same products as fp32 GEMMs over converted operands (the 2-core Zen 4 capped there, 12-04);
// below AVX512_CORE a scalar loop (a Zen 3: bf16 at 13-22 GFLOP/s in two operand layouts and 1-2
// in the third, against 60-125 for fp32). There the trainer multiplies 16-bit matrices as fp32
// ones; the tensors a step allocates are the same either way.
//
// oneDNN also takes a cap on the instructions it uses from the environment (ONEDNN_MAX_CPU_ISA,
// or the older DNNL_MAX_CPU_ISA: "AVX2" makes an AVX-512 CPU's oneDNN an AVX2 one, as on a Zen 3;
// "AVX512_CORE_VNNI" a Cascade Lake's). A cap below what a native GEMM needs leaves LibTorch its
// slower paths, so it counts as the CPU's lack.
#ifndef LLMCTL_COMMON_CPU_MATMUL_H_
#define LLMCTL_COMMON_CPU_MATMUL_H_

#include <algorithm>
#include <array>
#include <cctype>
#include <cstdlib>
#include <string>
#include <string_view>

namespace llmctl {

// Whether this CPU has AVX-512's core set (avx512f, bw, vl, dq), which oneDNN's AVX512_CORE
// kernels need.
inline bool CpuHasAvx512Core() {
  return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
         __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
}

// What a oneDNN ISA cap lets its GEMMs use, in oneDNN's order.
enum class OneDnnIsa { kBelowAvx512Core, kAvx512Core, kAvx512CoreBf16, kAvx512CoreFp16, kAny };

// A cap's value (ONEDNN_MAX_CPU_ISA's, any case) as the most it allows: the ISAs below AVX512_CORE
// (SSE41 to AVX2_VNNI_2), the AVX-512 ones without bf16 (AVX512_CORE, AVX512_CORE_VNNI) and
// AVX512_CORE_BF16; anything else (ALL, DEFAULT, the fp16 and AMX ones, none, a name oneDNN does
// not know and so ignores) caps nothing that matters here.
inline OneDnnIsa OneDnnIsaCap(std::string_view value) {
  std::string name(value);
  std::transform(name.begin(), name.end(), name.begin(),
                 [](unsigned char c) { return static_cast<char>(std::toupper(c)); });
  struct Cap {
    std::string_view name;
    OneDnnIsa allows;
  };
  constexpr std::array<Cap, 8> kCaps = {{{"SSE41", OneDnnIsa::kBelowAvx512Core},
                                         {"AVX", OneDnnIsa::kBelowAvx512Core},
                                         {"AVX2", OneDnnIsa::kBelowAvx512Core},
                                         {"AVX2_VNNI", OneDnnIsa::kBelowAvx512Core},
                                         {"AVX2_VNNI_2", OneDnnIsa::kBelowAvx512Core},
                                         {"AVX512_CORE", OneDnnIsa::kAvx512Core},
                                         {"AVX512_CORE_VNNI", OneDnnIsa::kAvx512Core},
                                         {"AVX512_CORE_BF16", OneDnnIsa::kAvx512CoreBf16}}};
  const auto cap =
      std::find_if(kCaps.begin(), kCaps.end(), [&](const Cap& c) { return c.name == name; });
  return cap == kCaps.end() ? OneDnnIsa::kAny : cap->allows;
}

// The cap's variable as oneDNN reads it: ONEDNN_MAX_CPU_ISA, else DNNL_MAX_CPU_ISA; "" for none.
inline std::string_view OneDnnIsaCapVariable() {
  for (const char* variable : {"ONEDNN_MAX_CPU_ISA", "DNNL_MAX_CPU_ISA"}) {
    if (const char* value = std::getenv(variable); value != nullptr && *value != '\0') {
      return value;
    }
  }
  return "";
}

// This process's cap, as oneDNN reads it.
inline OneDnnIsa OneDnnIsaCapOfEnvironment() { return OneDnnIsaCap(OneDnnIsaCapVariable()); }

// This process's cap as a rate probe records it: its name in capitals ("AVX2"); "" for none, and
// for a value that is no ISA's name (not 1 to 32 letters, digits and underscores), which oneDNN
// ignores.
inline std::string OneDnnIsaCapName() {
  std::string name(OneDnnIsaCapVariable());
  const bool a_name =
      !name.empty() && name.size() <= 32 && std::all_of(name.begin(), name.end(), [](char c) {
        return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') ||
               c == '_';
      });
  if (!a_name) return "";
  std::transform(name.begin(), name.end(), name.begin(),
                 [](unsigned char c) { return static_cast<char>(std::toupper(c)); });
  return name;
}

// Whether this CPU has LibTorch's native bf16 GEMM (oneDNN's, AVX512_CORE_BF16). Read once, as
// oneDNN reads its cap once: every 16-bit product of a step asks.
inline bool CpuMultipliesBf16() {
  static const bool multiplies = CpuHasAvx512Core() && __builtin_cpu_supports("avx512bf16") &&
                                 OneDnnIsaCapOfEnvironment() >= OneDnnIsa::kAvx512CoreBf16;
  return multiplies;
}

// Whether this CPU has LibTorch's native fp16 GEMM (oneDNN's, avx512_fp16).
inline bool CpuMultipliesFp16() {
  static const bool multiplies = __builtin_cpu_supports("avx512fp16") &&
                                 OneDnnIsaCapOfEnvironment() >= OneDnnIsa::kAvx512CoreFp16;
  return multiplies;
}

}  // namespace llmctl

#endif  // LLMCTL_COMMON_CPU_MATMUL_H_
