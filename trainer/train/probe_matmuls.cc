// The rate probe's matmul cells (rate_probe.cc): the grid of a projection's GEMMs, the vocabulary
// head's, the buffers those take from the allocator, and a projection's GEMMs at row counts new to
// the process. Internal to trainer/train/: not part of its API.
#include "trainer/train/probe_matmuls.h"

#include <torch/torch.h>

#include <algorithm>
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "common/cpu_matmul.h"
#include "common/estimate/reference_step.h"
#include "common/trial_config.h"
#include "trainer/kernels/linear.h"
#include "trainer/memory/accounting.h"

namespace llmctl::trainer {
namespace {

// The matmul grid: a micro-batch's token rows by a projection's weight width. A CPU trial's
// micro-batch holds tens to a few thousand rows, a GPU's thousands; the widths are a small model's
// hidden sizes up to a 7B model's (a LLaMA step's projections, its head's sqrt(hidden x vocab)).
// Fewer rows shorten the weight gradient's reduction and split worse over threads; a narrower
// weight reuses less of what the GEMM loads: measured 11-29 on a Zen 3, a LLaMA step's 190-row
// GEMMs ran at 33-55 GFLOP/s where a 512-row square one ran at 67 (one thread).
// The CPU's narrowest widths (version 6) are BLIP-2's small ViT and Q-Former (96 and 64 wide),
// whose GEMMs run far below a 256-wide one's (11-30, Zen 4, bf16 at 32 rows: 11, 33 and 95 GFLOP/s
// 64, 128 and 256 wide).
constexpr int64_t kCpuRows[] = {32, 128, 512, 2048};
constexpr int64_t kCpuWidths[] = {64, 128, 256, 512, 1024, 2048, 4096};
constexpr int64_t kCudaRows[] = {512, 2048, 8192};
constexpr int64_t kCudaWidths[] = {1024, 2048, 4096, 8192};
// A vocabulary head as the chunked loss runs it (version 11): a chunk's kLossChunkTokens rows of
// hidden states through a kHeadVocab-wide output, at narrow hidden widths. A head's inner dimension
// is a small model's hidden size and its output the vocabulary, a GEMM unlike the grid's square
// weights (12-02, Zen 4: llama-3.2-tiny's 128 x 128,256 head at 98 GFLOP/s where the grid's rate at
// sqrt(in x out) said 75). 16,384 wide, its fp32 weight (8 MiB at 128) is past a core's L2 as a
// real vocabulary's is, and one call at 256 wide takes about 65 ms, under kCallShare of the rounds.
constexpr int64_t kHeadHiddens[] = {64, 128, 256};
constexpr int64_t kHeadVocab = 16384;

struct Cell {
  int64_t rows = 0;
  int64_t width = 0;
  double flops() const { return 3 * 2 * static_cast<double>(rows * width * width); }
};

// `dtype`'s matmuls at `cells`, cheapest first: a projection's forward and both of its backward
// matmuls, (rows x width) x (width x width), the three layouts a training step runs. A cell whose
// call would take longer than `longest_call` at the best rate measured so far is left out, and so
// is every dearer one; the first is always measured.
void AddMatmuls(ProbeRounds& rounds, const std::string& dtype, std::vector<Cell> cells,
                double longest_call, estimate::RateProbe& probe) {
  std::sort(cells.begin(), cells.end(),
            [](const Cell& a, const Cell& b) { return a.flops() < b.flops(); });
  const auto options = torch::TensorOptions().dtype(ProbeDtype(dtype)).device(rounds.device());
  double rate = 0;
  // One weight a width, which that width's cells share: a 4,096-wide one is 16 Mi values (64 MiB
  // in fp32) to fill and hold, once and not once a cell.
  std::map<int64_t, torch::Tensor> weights;
  for (const Cell& cell : cells) {
    if (rate > 0 && cell.flops() / rate > longest_call) break;
    torch::Tensor& w = weights[cell.width];
    if (!w.defined()) w = ProbeOperand({cell.width, cell.width}, options);
    const torch::Tensor x = ProbeOperand({cell.rows, cell.width}, options);
    const torch::Tensor dy = ProbeOperand({cell.rows, cell.width}, options);
    const size_t row = probe.matmul.size();
    probe.matmul.push_back({dtype, cell.width, 0, cell.rows});
    const double once = rounds.Add(
        [w, x, dy] {
          (void)InputGradient(x, w);
          (void)Linear(dy, w);
          (void)Matmul(dy.t(), x);
        },
        [&probe, row, flops = cell.flops()](double seconds) {
          probe.matmul[row].flops_per_s = flops / seconds;
        });
    rate = std::max(rate, cell.flops() / once);
  }
}

// The rows of a new-shape cell's calls at a length every call had run at: a small model's
// micro-batch of one or two short rows (the grid's fewest-but-one) and, in natively multiplied
// bf16 (TimedPastFirstRows), of four (version 18: a new length's kernels cost more at more rows,
// 12-07, Xeon with AMX, bf16: 1.3-1.6x at 364 rows what they cost at 128, and no more at 728).
// fp32's GEMMs build nothing per shape (12-07, the Xeon as it is and held to AVX512_CORE_VNNI and
// to AVX2: its cells at 384 rows within 1.4 ms of their repeated calls either way, 62-97 ms a call
// at 2,048 x 4,096, 3-4 s of the probe), so fp32 is timed at the first alone. How far the cell's
// calls at new rows may stray from them: each call takes the next odd row count alternately below
// and above (rows - 1, + 1, - 3, + 3, ...), so their mean stays at the cell's rows. No other GEMM
// of the probe has an odd row count (the grid's and the head cells' are powers of two, the
// reference steps' two rows of a length), the two cells' ranges do not meet, and a cell's calls, at
// most the warm-up's 16 and one a round, stay well inside its range.
constexpr int64_t kNewShapeRows[] = {128, 384};
// The most weight values timed past the first of kNewShapeRows: the reference's head, 512 x 4,096.
// A 1B model's 2,048 x 4,096 took a bf16 call of 120 ms at 384 rows held to AVX2 (12-07, 2 s of
// the probe); past the most values a row count has, its cost follows the first's trend
// (NewLengthCost::ShapeSeconds).
constexpr double kNewShapeMostValuesPastFirstRows = 512.0 * 4096;
constexpr int64_t kNewShapeStray = 63;

// Whether a new-shape cell of `dtype` at `weight` is timed past kNewShapeRows' first: bf16 alone,
// where the CPU has LibTorch's native bf16 GEMM (common/cpu_matmul.h), up to
// kNewShapeMostValuesPastFirstRows. Elsewhere the trainer multiplies bf16 as fp32 GEMMs over
// converted operands, which build no more per shape than fp32's: on a 2-core Zen 3 (12-07, AVX2,
// no bf16) the 128-row bf16 cells' new calls came within -0.2 to +3.6 ms of their repeated ones,
// while their 384-row cells took about 1 s of the probe's 18-20 s.
bool TimedPastFirstRows(std::string_view dtype, const estimate::WeightShape& weight) {
  return dtype == "bf16" && CpuMultipliesBf16() &&
         weight.values() <= kNewShapeMostValuesPastFirstRows;
}

// A projection's three GEMMs through trainer/kernels/linear.h, as a step runs them: x W^T, dy W
// and dy^T x, x `rows` x in and dy `rows` x out (views of their first rows).
void ProjectionGemms(const torch::Tensor& w, const torch::Tensor& x, const torch::Tensor& dy,
                     int64_t rows) {
  const torch::Tensor x_rows = x.narrow(0, 0, rows);
  const torch::Tensor dy_rows = dy.narrow(0, 0, rows);
  (void)Linear(x_rows, w);
  (void)InputGradient(dy_rows, w);
  (void)Matmul(dy_rows.t(), x_rows);
}

}  // namespace

// `dtype`'s head cells (kHeadHiddens), narrowest first: the chunked loss' three GEMMs over a
// chunk through trainer/kernels/linear.h, the logits x W^T, the hidden states' gradient dy W and
// the weight's dy^T x (trainer/model/loss.cc's PlainHeadChunks). A cell whose call would take
// longer than `longest_call` at the best rate so far is left out, and so is every wider one.
void AddHeadMatmuls(ProbeRounds& rounds, const std::string& dtype, double longest_call,
                    estimate::RateProbe& probe) {
  const auto options = torch::TensorOptions().dtype(ProbeDtype(dtype)).device(rounds.device());
  double rate = 0;
  for (const int64_t hidden : kHeadHiddens) {
    const double flops = 3 * 2 * static_cast<double>(kLossChunkTokens * hidden * kHeadVocab);
    if (rate > 0 && flops / rate > longest_call) break;
    const torch::Tensor w = ProbeOperand({kHeadVocab, hidden}, options);
    const torch::Tensor x = ProbeOperand({kLossChunkTokens, hidden}, options);
    const torch::Tensor dy = ProbeOperand({kLossChunkTokens, kHeadVocab}, options);
    const size_t row = probe.head_matmul.size();
    probe.head_matmul.push_back({dtype, kLossChunkTokens, hidden, kHeadVocab, 0});
    const double once = rounds.Add(
        [w, x, dy] {
          (void)Matmul(x, w.t());
          (void)InputGradient(dy, w);
          (void)Matmul(dy.t(), x);
        },
        [&probe, row, flops](double seconds) {
          probe.head_matmul[row].flops_per_s = flops / seconds;
        });
    rate = std::max(rate, flops / once);
  }
}

// What each of a vocabulary head's three GEMMs takes from LibTorch's allocator beside its operands
// and output while it runs (common/estimate/matmul_buffers.h), for every measured head cell's dtype
// and hidden width at each of kProbeHeadBufferVocabs: each GEMM run once to create its kernel and
// once between the counting allocator's figures, at the rounds' threads. A CPU's: run after the
// rounds, so that installing the counting allocator changes no rate.
Status AddHeadBuffers(estimate::RateProbe& probe) {
  ASSIGN_OR_RETURN(DeviceMemory memory, DeviceMemory::For(torch::Device(torch::kCPU)));
  // The bytes `product` takes beside what it returns, and the tensors alive before it.
  const auto buffer_of = [&memory](const std::function<torch::Tensor()>& product) {
    (void)product();
    const uint64_t before = memory.allocated_bytes();
    memory.ResetPeak();
    const torch::Tensor out = product();
    const uint64_t held = before + out.storage().nbytes();
    const uint64_t peak = memory.peak_bytes();
    return peak > held ? peak - held : uint64_t{0};
  };
  for (const estimate::ProbedHead& head : probe.head_matmul) {
    const auto options = torch::TensorOptions().dtype(ProbeDtype(head.dtype));
    for (const int64_t vocab : estimate::kProbeHeadBufferVocabs) {
      const torch::Tensor w = ProbeOperand({vocab, head.hidden}, options);
      const torch::Tensor x = ProbeOperand({head.tokens, head.hidden}, options);
      const torch::Tensor dy = ProbeOperand({head.tokens, vocab}, options);
      probe.head_buffers.push_back(
          {.dtype = head.dtype,
           .tokens = head.tokens,
           .hidden = head.hidden,
           .vocab = vocab,
           .logits_bytes = buffer_of([&] { return Matmul(x, w.t()); }),
           .input_gradient_bytes = buffer_of([&] { return InputGradient(dy, w); }),
           .weight_gradient_bytes = buffer_of([&] { return Matmul(dy.t(), x); })});
    }
  }
  return Status::Ok();
}

// fp32 and bf16 at each of NewShapeWeights (common/estimate/reference_step.h) and each of their
// kNewShapeRows: a projection's GEMMs at those rows, and (one call a sample) at row counts no call
// had (rate_probe.h's new_shapes). A CPU's.
Status AddNewShapes(ProbeRounds& rounds, estimate::RateProbe& probe) {
  ASSIGN_OR_RETURN(const std::vector<estimate::WeightShape> weights, estimate::NewShapeWeights());
  for (const char* dtype : {"fp32", "bf16"}) {
    const auto options = torch::TensorOptions().dtype(ProbeDtype(dtype)).device(rounds.device());
    for (const int64_t rows : kNewShapeRows) {
      for (const estimate::WeightShape& weight : weights) {
        if (rows != kNewShapeRows[0] && !TimedPastFirstRows(dtype, weight)) continue;
        const torch::Tensor w = ProbeOperand({weight.out, weight.in}, options);
        const torch::Tensor x = ProbeOperand({rows + kNewShapeStray, weight.in}, options);
        const torch::Tensor dy = ProbeOperand({rows + kNewShapeStray, weight.out}, options);
        const size_t row = probe.new_shapes.size();
        probe.new_shapes.push_back({dtype, weight.in, weight.out, rows, 0, 0});
        rounds.Add(
            [w, x, dy, rows] { ProjectionGemms(w, x, dy, rows); },
            [&probe, row](double seconds) { probe.new_shapes[row].repeated_seconds = seconds; });
        int64_t calls = 0;
        rounds.Add(
            [w, x, dy, rows, calls]() mutable {
              // 1, 1, 3, 3, 5, ... below then above: no row count twice in kNewShapeStray + 1
              // calls.
              const int64_t stray = 2 * (calls / 2 % ((kNewShapeStray + 1) / 2)) + 1;
              ProjectionGemms(w, x, dy, rows + (calls % 2 == 0 ? -stray : stray));
              ++calls;
            },
            [&probe, row](double seconds) { probe.new_shapes[row].new_seconds = seconds; },
            /*most_calls=*/1);
      }
    }
  }
  return Status::Ok();
}

// fp32 and bf16 over the whole grid (the estimate's two matmul classes); fp16, which no estimate
// uses, at the grid's first rows and two narrowest widths, for `llmctl nodes`.
void AddMatmulGrid(ProbeRounds& rounds, double longest_call, estimate::RateProbe& probe) {
  const std::vector<int64_t> rows = ForDevice(rounds.device(), kCudaRows, kCpuRows);
  const std::vector<int64_t> widths = ForDevice(rounds.device(), kCudaWidths, kCpuWidths);
  std::vector<Cell> grid;
  for (const int64_t r : rows) {
    for (const int64_t w : widths) grid.push_back({r, w});
  }
  AddMatmuls(rounds, "fp32", grid, longest_call, probe);
  AddMatmuls(rounds, "bf16", grid, longest_call, probe);
  AddMatmuls(rounds, "fp16", {{rows[0], widths[0]}, {rows[0], widths[1]}}, longest_call, probe);
}

}  // namespace llmctl::trainer
