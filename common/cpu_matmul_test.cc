#include "common/cpu_matmul.h"

#include <gtest/gtest.h>
#include <stdlib.h>

#include <string>

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

// The cap a rate probe records: the variable oneDNN reads (ONEDNN_MAX_CPU_ISA before the older
// DNNL_MAX_CPU_ISA) in capitals; none for a value that names no ISA, which oneDNN ignores (a
// newline or a long value would otherwise travel into the probe's identity).
TEST(OneDnnIsaCapTest, TheNameRecordedIsTheVariableOneDnnReads) {
  ::unsetenv("ONEDNN_MAX_CPU_ISA");
  ::unsetenv("DNNL_MAX_CPU_ISA");
  EXPECT_EQ(OneDnnIsaCapName(), "");
  ::setenv("DNNL_MAX_CPU_ISA", "avx2", 1);
  EXPECT_EQ(OneDnnIsaCapName(), "AVX2");
  ::setenv("ONEDNN_MAX_CPU_ISA", "Avx512_Core_Vnni", 1);
  EXPECT_EQ(OneDnnIsaCapName(), "AVX512_CORE_VNNI");
  EXPECT_EQ(OneDnnIsaCapOfEnvironment(), OneDnnIsa::kAvx512Core);
  for (const std::string& ignored : {std::string("AVX2\nAVX512"), std::string("-1"),
                                     std::string("%s%n"), std::string(33, 'A')}) {
    ::setenv("ONEDNN_MAX_CPU_ISA", ignored.c_str(), 1);
    EXPECT_EQ(OneDnnIsaCapName(), "") << ignored;
  }
  ::setenv("ONEDNN_MAX_CPU_ISA", std::string(32, 'A').c_str(), 1);
  EXPECT_EQ(OneDnnIsaCapName(), std::string(32, 'A'));
  ::unsetenv("ONEDNN_MAX_CPU_ISA");
  ::unsetenv("DNNL_MAX_CPU_ISA");
}

}  // namespace
}  // namespace llmctl
