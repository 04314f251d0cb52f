// Safetensors files: a validating reader (the file mapped, or its header alone: safetensors.cc), an
// atomic writer (safetensors_writer.cc), and sharded checkpoints (sharded_checkpoint.cc).
//
// Format (https://github.com/huggingface/safetensors): an 8-byte little-endian header length N, N
// bytes of UTF-8 JSON {"name": {"dtype": "F32", "shape": [2, 3], "data_offsets": [begin, end]},
// ...,
// "__metadata__": {"key": "value"}}, then the byte buffer; offsets are relative to the buffer's
// start.
//
// Checkpoints come from anywhere (a download, a half-copied disk), so the reader trusts nothing in
// the header: every length, offset and shape is checked before a view is handed out, and each
// failure is a one-line Status naming the file and, where there is one, the tensor. No LibTorch
// here: the trainer turns TensorViews into tensors.
#ifndef LLMCTL_COMMON_SAFETENSORS_SAFETENSORS_H_
#define LLMCTL_COMMON_SAFETENSORS_SAFETENSORS_H_

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "common/files.h"
#include "common/status.h"

namespace llmctl::safetensors {

// The dtypes the trainer can load. Others in the spec (F8_E4M3, U16, ...) are refused by name.
enum class DType { kF64, kF32, kF16, kBF16, kI64, kI32, kI16, kI8, kU8, kBool };

// "F32", "BF16", "BOOL", ... as spelled in the header.
std::string_view DTypeName(DType dtype);
// Bytes per element: 8, 4, 2, 2, 8, 4, 2, 1, 1, 1.
size_t DTypeSize(DType dtype);
// Parses a header spelling; fails with "unsupported dtype 'X'" for anything else.
StatusOr<DType> ParseDType(std::string_view name);
// F64, F32, F16, BF16: what a model's weights may be stored as.
bool IsFloatingPoint(DType dtype);
// "[2, 3]", as messages show a shape.
std::string ShapeString(std::span<const int64_t> shape);

// One tensor inside a mapped file. `bytes` points into the mapping and lives as long as the file
// object. It is element-aligned when the writer padded the header to 8 bytes and ordered tensors by
// dtype size, as the reference writer and ours do; other writers' files may give unaligned bytes,
// so copy, don't cast.
struct TensorView {
  std::string name;
  DType dtype;
  std::vector<int64_t> shape;  // [] for a scalar
  std::span<const std::byte> bytes;

  int64_t numel() const;  // product of shape; 1 for a scalar
};

// Largest header the reader accepts, as in the reference implementation: a bigger N is a corrupt or
// hostile file, not a real checkpoint (a 70B model's header is a few hundred KB).
inline constexpr uint64_t kMaxHeaderBytes = 100'000'000;

// What SafetensorsFile::Open reads of a file.
enum class Reading {
  // The whole file mapped: views' bytes point into the mapping. For the trainer, which loads the
  // weights (and reports a file that shrinks under it: MappedFile).
  kWeights,
  // The header alone, read with pread; nothing is mapped and every view's bytes are empty (its
  // size is its shape's times its dtype's). For checks that read no weight (the inputs check that
  // llmctl submit and plan run): a file another process truncates meanwhile is an error, where a
  // mapping would kill the process with SIGBUS.
  kHeaderOnly,
};

class SafetensorsFile {
 public:
  // Reads `path` as `reading` says and validates the header against the file's size. Errors are
  // NotFound (cannot open), DataLoss (malformed or lying file), Unimplemented (unsupported dtype).
  static StatusOr<std::unique_ptr<SafetensorsFile>> Open(const std::string& path,
                                                         Reading reading = Reading::kWeights);

  // Parses a complete file image already in memory (the fuzzer's entry point, and for tests).
  // Borrows `file_bytes`: the caller keeps them alive as long as the returned object.
  // `display_name` stands in for the path in error messages.
  static StatusOr<std::unique_ptr<SafetensorsFile>> FromBuffer(
      std::span<const std::byte> file_bytes, std::string display_name);

  ~SafetensorsFile();  // unmaps
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  const std::string& path() const { return path_; }
  // In buffer order (ascending data_offsets), which is the order to read a file sequentially.
  const std::vector<TensorView>& tensors() const { return tensors_; }
  // nullptr when absent.
  const TensorView* Find(std::string_view name) const;
  // "__metadata__" (e.g. {"format": "pt"}); empty when the header has none.
  const std::map<std::string, std::string>& metadata() const { return metadata_; }

 private:
  SafetensorsFile() = default;
  Status Parse(std::span<const std::byte> file_bytes);
  // The header's text against a data buffer of `buffer_size` bytes at `buffer`, or nullptr when it
  // was not read (Reading::kHeaderOnly).
  Status ParseHeader(std::string_view header_text, uint64_t buffer_size, const std::byte* buffer);

  std::string path_;
  std::unique_ptr<MappedFile> mapping_;  // null for FromBuffer and Reading::kHeaderOnly
  std::vector<TensorView> tensors_;
  std::unordered_map<std::string_view, size_t> by_name_;  // keys view tensors_[i].name
  std::map<std::string, std::string> metadata_;
};

// A tensor for WriteSafetensors; `bytes` holds numel × DTypeSize(dtype) little-endian bytes.
struct TensorToWrite {
  std::string name;
  DType dtype;
  std::vector<int64_t> shape;
  std::span<const std::byte> bytes;
};

// Writes a safetensors file laid out as the reference writer does (tensors ordered by dtype, widest
// first, then by name, so every tensor is element-aligned; header padded with spaces to a multiple
// of 8): the same tensors and metadata give the same bytes as Python's save_file. Writes
// `path`.tmp, fsyncs and renames it over `path`, so a crash never leaves a truncated file under the
// real name. Fails on duplicate names, the reserved name "__metadata__", negative dims, or a byte
// count that does not match the shape.
Status WriteSafetensors(const std::string& path, const std::vector<TensorToWrite>& tensors,
                        const std::map<std::string, std::string>& metadata = {});

// A Hugging Face model directory's weights: either model.safetensors, or
// model.safetensors.index.json
// ({"metadata": {...}, "weight_map": {"tensor": "model-00001-of-00002.safetensors", ...}}) and its
// shards. Every shard is opened once, as `reading` says; views point into the shards and live as
// long as this object.
class ShardedCheckpoint {
 public:
  // Looks in `dir` for model.safetensors first, then model.safetensors.index.json (the order
  // transformers uses).
  static StatusOr<std::unique_ptr<ShardedCheckpoint>> Open(const std::string& dir,
                                                           Reading reading = Reading::kWeights);
  // Opens an index file; shard names resolve relative to its directory.
  static StatusOr<std::unique_ptr<ShardedCheckpoint>> OpenIndex(
      const std::string& index_path, Reading reading = Reading::kWeights);
  // Wraps one safetensors file.
  static StatusOr<std::unique_ptr<ShardedCheckpoint>> OpenFile(const std::string& path,
                                                               Reading reading = Reading::kWeights);

  // nullptr when absent.
  const TensorView* Find(std::string_view name) const;
  // All tensor names, sorted.
  const std::vector<std::string>& names() const { return names_; }
  // The shard files, in the order they were opened.
  const std::vector<std::unique_ptr<SafetensorsFile>>& shards() const { return shards_; }
  // The index's "metadata" (values that are not strings, such as total_size, as their JSON text),
  // or the single file's "__metadata__".
  const std::map<std::string, std::string>& metadata() const { return metadata_; }

 private:
  ShardedCheckpoint() = default;

  std::vector<std::unique_ptr<SafetensorsFile>> shards_;
  std::map<std::string, const TensorView*, std::less<>> by_name_;
  std::vector<std::string> names_;
  std::map<std::string, std::string> metadata_;
};

}  // namespace llmctl::safetensors

#endif  // LLMCTL_COMMON_SAFETENSORS_SAFETENSORS_H_
