#include "common/cpu_matmul.h"

#include <gtest/gtest.h>

namespace llmctl {
namespace {

// ONEDNN_MAX_CPU_ISA's values, as oneDNN orders them: below AVX512_CORE LibTorch has no 16-bit
// GEMM, below AVX512_CORE_BF16 no native bf16 one, and fp16's needs AVX512_CORE_FP16 (AVX10_1_512)
// or above.
TEST(OneDnnIsaCapTest, OrdersTheCapsAsOneDnnDoes) {
  for (const char* below : {"SSE41", "AVX", "AVX2", "avx2", "AVX2_VNNI", "avx2_vnni_2"}) {
    EXPECT_EQ(OneDnnIsaCap(below), OneDnnIsa::kBelowAvx512Core) << below;
  }
  for (const char* core : {"AVX512_CORE", "avx512_core_vnni", "Avx512_Core"}) {
    EXPECT_EQ(OneDnnIsaCap(core), OneDnnIsa::kAvx512Core) << core;
  }
  for (const char* bf16 : {"AVX512_CORE_BF16", "avx512_core_bf16"}) {
    EXPECT_EQ(OneDnnIsaCap(bf16), OneDnnIsa::kAvx512CoreBf16) << bf16;
  }
  // The fp16 and AMX caps, "all", "default", none and a name oneDNN would ignore cap nothing here.
  for (const char* any : {"AVX10_1_512", "AVX512_CORE_FP16", "AVX10_1_512_AMX", "AVX512_CORE_AMX",
                          "AVX512_CORE_AMX_FP16", "ALL", "DEFAULT", "", "AVX3"}) {
    EXPECT_EQ(OneDnnIsaCap(any), OneDnnIsa::kAny) << any;
  }
  EXPECT_LT(OneDnnIsa::kBelowAvx512Core, OneDnnIsa::kAvx512Core);
  EXPECT_LT(OneDnnIsa::kAvx512Core, OneDnnIsa::kAvx512CoreBf16);
  EXPECT_LT(OneDnnIsa::kAvx512CoreBf16, OneDnnIsa::kAvx512CoreFp16);
}

}  // namespace
}  // namespace llmctl
