// How the process's heap treats the large blocks a training step frees: kept for the next step.
//
// glibc's malloc serves a block over its mmap threshold (at most 32 MiB by default) with a fresh
// mmap and unmaps it on free, and returns the heap's free top to the system past its trim
// threshold. A step's large tensors (a 128k vocabulary's logits: 2 x 128 x 128,256 fp32 values,
// 131 MB, and their casts and gradients) are then mapped, faulted in page by page and unmapped
// again every step: on a 2-core Zen 4 the kernels: aten bf16-true step of bench/models/
// llama-3.2-tiny took 0.35 s, of which the loss's few passes over its logits ~0.2 s, where
// `llmctl estimate` counted 0.16 s of work; with the blocks kept, 0.14 s. LibTorch's CPU
// allocator is malloc, so the counting allocator's bytes, the peaks the product reports, do not
// change; the process's resident memory stays at its high-water mark instead of falling between
// steps.
#ifndef LLMCTL_TRAINER_MEMORY_HOST_HEAP_H_
#define LLMCTL_TRAINER_MEMORY_HOST_HEAP_H_

namespace llmctl::trainer {

// Serves every block up to 2 GiB from the heap and keeps freed memory in it for reuse (glibc's
// M_MMAP_THRESHOLD and M_TRIM_THRESHOLD). Idempotent; a no-op where malloc is not glibc's.
void KeepFreedHostMemory();

}  // namespace llmctl::trainer

#endif  // LLMCTL_TRAINER_MEMORY_HOST_HEAP_H_
