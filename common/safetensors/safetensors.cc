#include "common/safetensors/safetensors.h"

#include <sys/stat.h>

#include <algorithm>
#include <bit>
#include <cstring>
#include <limits>
#include <nlohmann/json.hpp>
#include <numeric>
#include <utility>

#include "common/files.h"
#include "common/safetensors/strict_json.h"
#include "common/text.h"

namespace llmctl::safetensors {
namespace {

static_assert(std::endian::native == std::endian::little,
              "safetensors stores little-endian data; views hand the bytes out unconverted");

using Json = nlohmann::json;
using internal::JsonTypeName;
using internal::kMaxQuotedBytes;
using internal::ParseJsonStrict;

struct DTypeInfo {
  DType dtype;
  std::string_view name;
  size_t size;
};
constexpr DTypeInfo kDTypes[] = {
    {DType::kF64, "F64", 8},   {DType::kF32, "F32", 4}, {DType::kF16, "F16", 2},
    {DType::kBF16, "BF16", 2}, {DType::kI64, "I64", 8}, {DType::kI32, "I32", 4},
    {DType::kI16, "I16", 2},   {DType::kI8, "I8", 1},   {DType::kU8, "U8", 1},
    {DType::kBool, "BOOL", 1},
};

// A non-negative JSON integer that fits int64, or an error naming `field`.
StatusOr<uint64_t> NonNegativeInt(const Json& v, const std::string& context,
                                  std::string_view field) {
  if (v.is_number_unsigned()) {
    const uint64_t u = v.get<uint64_t>();
    if (u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
      return DataLossError(context + ": " + std::string(field) + " value " + std::to_string(u) +
                           " is too large");
    }
    return u;
  }
  if (v.is_number_integer()) {
    return DataLossError(context + ": " + std::string(field) + " value " +
                         std::to_string(v.get<int64_t>()) + " is negative");
  }
  return DataLossError(context + ": " + std::string(field) + " must hold integers, got " +
                       JsonTypeName(v));
}

struct ParsedEntry {
  std::string name;
  DType dtype;
  std::vector<int64_t> shape;
  uint64_t begin, end;
};

// A tensor's shape and the bytes it needs.
struct ShapeBytes {
  std::vector<int64_t> dims;
  uint64_t bytes = 0;
};

// The entry's 'shape' and its byte count as `dtype`.
StatusOr<ShapeBytes> ParseShape(const std::string& context, const Json& shape, DType dtype) {
  if (!shape.is_array()) {
    return DataLossError(context + ": 'shape' must be an array, got " + JsonTypeName(shape));
  }
  // Checked multiplication: a lying shape such as [2^40, 2^40] must not wrap to a small byte count
  // that happens to match the offsets.
  ShapeBytes out;
  out.bytes = DTypeSize(dtype);
  bool overflow = false;
  out.dims.reserve(shape.size());
  for (const Json& d : shape) {
    ASSIGN_OR_RETURN(const uint64_t dim, NonNegativeInt(d, context, "'shape'"));
    out.dims.push_back(static_cast<int64_t>(dim));
    uint64_t product;
    if (__builtin_mul_overflow(out.bytes, dim, &product)) overflow = true;
    out.bytes = product;
  }
  if (overflow || out.bytes > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
    return DataLossError(context + ": shape " + ShapeString(out.dims) +
                         " overflows a 64-bit byte count");
  }
  return out;
}

Status ParseEntry(const std::string& path, const std::string& name, const Json& entry,
                  uint64_t buffer_size, ParsedEntry* out) {
  const std::string context = path + ": tensor '" + OnOneLine(name, kMaxQuotedBytes) + "'";
  if (!entry.is_object()) {
    return DataLossError(context + ": entry must be an object, got " + JsonTypeName(entry));
  }
  for (const char* field : {"dtype", "shape", "data_offsets"}) {
    if (!entry.contains(field)) {
      return DataLossError(context + ": missing field '" + field + "'");
    }
  }
  const Json& dtype = entry["dtype"];
  if (!dtype.is_string()) {
    return DataLossError(context + ": 'dtype' must be a string, got " + JsonTypeName(dtype));
  }
  StatusOr<DType> parsed_dtype = ParseDType(dtype.get_ref<const std::string&>());
  if (!parsed_dtype.ok()) {
    return UnimplementedError(parsed_dtype.status().message() + " for tensor '" +
                              OnOneLine(name, kMaxQuotedBytes) + "' in " + path);
  }

  ASSIGN_OR_RETURN(ShapeBytes shape, ParseShape(context, entry["shape"], *parsed_dtype));
  const Json& offsets = entry["data_offsets"];
  if (!offsets.is_array() || offsets.size() != 2) {
    return DataLossError(context + ": 'data_offsets' must be an array [begin, end], got " +
                         (offsets.is_array() ? "an array of " + std::to_string(offsets.size())
                                             : std::string(JsonTypeName(offsets))));
  }
  ASSIGN_OR_RETURN(const uint64_t begin, NonNegativeInt(offsets[0], context, "'data_offsets'"));
  ASSIGN_OR_RETURN(const uint64_t end, NonNegativeInt(offsets[1], context, "'data_offsets'"));
  if (end < begin) {
    return DataLossError(context + ": data_offsets [" + std::to_string(begin) + ", " +
                         std::to_string(end) + "] end before they begin");
  }
  if (end > buffer_size) {
    return DataLossError(context + ": data_offsets [" + std::to_string(begin) + ", " +
                         std::to_string(end) + "] run past the " + std::to_string(buffer_size) +
                         "-byte data buffer (truncated file?)");
  }
  if (end - begin != shape.bytes) {
    return DataLossError(context + ": shape " + ShapeString(shape.dims) + " of " +
                         std::string(DTypeName(*parsed_dtype)) + " needs " +
                         std::to_string(shape.bytes) + " bytes but data_offsets [" +
                         std::to_string(begin) + ", " + std::to_string(end) + "] hold " +
                         std::to_string(end - begin));
  }
  *out = ParsedEntry{name, *parsed_dtype, std::move(shape.dims), begin, end};
  return Status::Ok();
}

// A file's parts: its header's text and the data buffer after it.
struct FileParts {
  std::string_view header_text;
  std::span<const std::byte> buffer;
};

// DataLoss when a `file_size`-byte file is too short to hold the 8-byte header length.
Status CheckHoldsHeaderLength(const std::string& path, uint64_t file_size) {
  if (file_size >= 8) return Status::Ok();
  return DataLossError(path + ": file is " + std::to_string(file_size) +
                       " bytes, shorter than the 8-byte header length");
}

// The 8-byte little-endian header length at `bytes`; DataLoss when it is past the limit or the end
// of the `file_size`-byte file.
StatusOr<uint64_t> HeaderLength(const std::string& path, const void* bytes, uint64_t file_size) {
  uint64_t header_len;
  std::memcpy(&header_len, bytes, 8);  // little-endian, checked by the static_assert
  if (header_len > kMaxHeaderBytes) {
    return DataLossError(path + ": header length " + std::to_string(header_len) + " exceeds the " +
                         std::to_string(kMaxHeaderBytes) + "-byte limit (not a safetensors file?)");
  }
  if (header_len > file_size - 8) {
    return DataLossError(path + ": header length " + std::to_string(header_len) +
                         " runs past the end of the " + std::to_string(file_size) +
                         "-byte file (truncated?)");
  }
  return header_len;
}

// `file` split at its 8-byte little-endian header length.
StatusOr<FileParts> SplitFile(const std::string& path, std::span<const std::byte> file) {
  RETURN_IF_ERROR(CheckHoldsHeaderLength(path, file.size()));
  ASSIGN_OR_RETURN(const uint64_t header_len, HeaderLength(path, file.data(), file.size()));
  return FileParts{.header_text = {reinterpret_cast<const char*>(file.data()) + 8, header_len},
                   .buffer = file.subspan(8 + header_len)};
}

// The header's "__metadata__": an object of strings, or null for none.
StatusOr<std::map<std::string, std::string>> ParseMetadata(const std::string& path,
                                                           const Json& value) {
  std::map<std::string, std::string> metadata;
  if (value.is_null()) return metadata;
  if (!value.is_object()) {
    return DataLossError(path + ": '__metadata__' must be an object of strings, got " +
                         JsonTypeName(value));
  }
  for (const auto& [key, text] : value.items()) {
    if (!text.is_string()) {
      return DataLossError(path + ": '__metadata__' value for '" + OnOneLine(key, kMaxQuotedBytes) +
                           "' must be a string, got " + JsonTypeName(text));
    }
    metadata[key] = text.get<std::string>();
  }
  return metadata;
}

// The entries' indices in buffer order, when they tile the `buffer_size`-byte buffer exactly, as
// the spec requires: no overlap (two tensors sharing bytes is how a hostile file aliases weights)
// and no holes (bytes nobody owns mean the header and data disagree). Zero-size tensors sit
// anywhere on a boundary.
StatusOr<std::vector<size_t>> OrderTilingTheBuffer(const std::string& path,
                                                   const std::vector<ParsedEntry>& entries,
                                                   uint64_t buffer_size) {
  std::vector<size_t> order(entries.size());
  std::iota(order.begin(), order.end(), size_t{0});
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    if (entries[a].begin != entries[b].begin) return entries[a].begin < entries[b].begin;
    if (entries[a].end != entries[b].end) return entries[a].end < entries[b].end;
    return entries[a].name < entries[b].name;
  });
  uint64_t expected = 0;
  const ParsedEntry* previous = nullptr;
  for (size_t i : order) {
    const ParsedEntry& e = entries[i];
    if (e.begin < expected) {
      return DataLossError(path + ": tensor '" + OnOneLine(e.name, kMaxQuotedBytes) +
                           "' at bytes [" + std::to_string(e.begin) + ", " + std::to_string(e.end) +
                           ") overlaps tensor '" + OnOneLine(previous->name, kMaxQuotedBytes) +
                           "' ending at " + std::to_string(expected));
    }
    if (e.begin > expected) {
      return DataLossError(path + ": bytes [" + std::to_string(expected) + ", " +
                           std::to_string(e.begin) +
                           ") of the data buffer belong to no tensor (hole " + "before tensor '" +
                           OnOneLine(e.name, kMaxQuotedBytes) + "')");
    }
    expected = e.end;
    previous = &e;
  }
  if (expected != buffer_size) {
    return DataLossError(path + ": the data buffer is " + std::to_string(buffer_size) +
                         " bytes but the tensors cover only " + std::to_string(expected) +
                         " (trailing bytes belong to no tensor)");
  }
  return order;
}

}  // namespace

std::string_view DTypeName(DType dtype) {
  for (const DTypeInfo& info : kDTypes) {
    if (info.dtype == dtype) return info.name;
  }
  return "?";
}

size_t DTypeSize(DType dtype) {
  for (const DTypeInfo& info : kDTypes) {
    if (info.dtype == dtype) return info.size;
  }
  return 0;
}

StatusOr<DType> ParseDType(std::string_view name) {
  for (const DTypeInfo& info : kDTypes) {
    if (info.name == name) return info.dtype;
  }
  return UnimplementedError("unsupported dtype '" + OnOneLine(name, kMaxQuotedBytes) + "'");
}

bool IsFloatingPoint(DType dtype) {
  return dtype == DType::kF64 || dtype == DType::kF32 || dtype == DType::kF16 ||
         dtype == DType::kBF16;
}

std::string ShapeString(std::span<const int64_t> shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i) s += ", ";
    s += std::to_string(shape[i]);
  }
  return s + "]";
}

int64_t TensorView::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;  // cannot overflow: the reader checked shape × dtype size
  return n;
}

StatusOr<std::unique_ptr<SafetensorsFile>> SafetensorsFile::Open(const std::string& path,
                                                                 Reading reading) {
  std::unique_ptr<SafetensorsFile> file(new SafetensorsFile());
  file->path_ = path;
  if (reading == Reading::kWeights) {
    ASSIGN_OR_RETURN(file->mapping_, MappedFile::Open(path));
    RETURN_IF_ERROR(file->Parse(file->mapping_->bytes()));
    return file;
  }
  struct stat st;
  ASSIGN_OR_RETURN(const UniqueFd fd, OpenRegularFile(path, st));
  const auto size = static_cast<uint64_t>(st.st_size);
  RETURN_IF_ERROR(CheckHoldsHeaderLength(path, size));
  ASSIGN_OR_RETURN(const std::string length_bytes, ReadFileRange(fd.get(), path, 0, 8));
  ASSIGN_OR_RETURN(const uint64_t header_len, HeaderLength(path, length_bytes.data(), size));
  ASSIGN_OR_RETURN(const std::string header_text, ReadFileRange(fd.get(), path, 8, header_len));
  RETURN_IF_ERROR(file->ParseHeader(header_text, size - 8 - header_len, /*buffer=*/nullptr));
  return file;
}

StatusOr<std::unique_ptr<SafetensorsFile>> SafetensorsFile::FromBuffer(
    std::span<const std::byte> file_bytes, std::string display_name) {
  std::unique_ptr<SafetensorsFile> file(new SafetensorsFile());
  file->path_ = std::move(display_name);
  RETURN_IF_ERROR(file->Parse(file_bytes));
  return file;
}

SafetensorsFile::~SafetensorsFile() = default;

const TensorView* SafetensorsFile::Find(std::string_view name) const {
  const auto it = by_name_.find(name);
  return it == by_name_.end() ? nullptr : &tensors_[it->second];
}

Status SafetensorsFile::Parse(std::span<const std::byte> file) {
  ASSIGN_OR_RETURN(const FileParts parts, SplitFile(path_, file));
  return ParseHeader(parts.header_text, parts.buffer.size(), parts.buffer.data());
}

Status SafetensorsFile::ParseHeader(std::string_view header_text, uint64_t buffer_size,
                                    const std::byte* buffer) {
  ASSIGN_OR_RETURN(const Json header, ParseJsonStrict(header_text, path_ + ": header"));
  if (!header.is_object()) {
    return DataLossError(path_ + ": header must be a JSON object, got " + JsonTypeName(header));
  }
  std::vector<ParsedEntry> entries;
  entries.reserve(header.size());
  for (const auto& [key, value] : header.items()) {
    if (key == "__metadata__") {
      ASSIGN_OR_RETURN(metadata_, ParseMetadata(path_, value));
      continue;
    }
    ParsedEntry entry;
    RETURN_IF_ERROR(ParseEntry(path_, key, value, buffer_size, &entry));
    entries.push_back(std::move(entry));
  }
  ASSIGN_OR_RETURN(const std::vector<size_t> order,
                   OrderTilingTheBuffer(path_, entries, buffer_size));
  tensors_.reserve(entries.size());
  for (size_t i : order) {
    ParsedEntry& e = entries[i];
    const std::span<const std::byte> bytes =
        buffer != nullptr ? std::span<const std::byte>(buffer + e.begin, e.end - e.begin)
                          : std::span<const std::byte>();
    tensors_.push_back(TensorView{std::move(e.name), e.dtype, std::move(e.shape), bytes});
  }
  // Built after tensors_ stops growing: the keys view the names stored there.
  by_name_.reserve(tensors_.size());
  for (size_t i = 0; i < tensors_.size(); ++i) by_name_.emplace(tensors_[i].name, i);
  return Status::Ok();
}

}  // namespace llmctl::safetensors
