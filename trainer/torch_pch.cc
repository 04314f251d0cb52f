// The translation unit that owns LibTorch's precompiled header (llmctl_torch_pch in
// trainer/CMakeLists.txt); it compiles nothing of its own.
