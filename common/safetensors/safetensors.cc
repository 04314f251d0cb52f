#include "common/safetensors/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <limits>
#include <nlohmann/json.hpp>
#include <numeric>
#include <set>
#include <utility>

#include "common/atomic_file.h"
#include "common/files.h"
#include "common/text.h"

namespace llmctl::safetensors {
namespace {

static_assert(std::endian::native == std::endian::little,
              "safetensors stores little-endian data; views hand the bytes out unconverted");

using Json = nlohmann::json;

// Nesting deeper than this cannot be a real header (the deepest legal value is a shape array at
// depth 3); refusing early keeps a hostile "[[[[..." from exhausting memory or the stack.
constexpr int kMaxJsonDepth = 64;

struct JsonTooDeep {};

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

// Tensor names and dtypes come from the file: each error quotes them through OnOneLine cut to this,
// so that it stays one readable line whatever the file holds.
constexpr size_t kMaxQuotedBytes = 120;

// nlohmann's messages start with "[json.exception.parse_error.101] "; the category adds nothing for
// a user, and the rest can quote the offending input, so it goes through OnOneLine too.
std::string JsonErrorText(const std::exception& e) {
  std::string_view what = e.what();
  if (!what.empty() && what.front() == '[') {
    const size_t close = what.find("] ");
    if (close != std::string_view::npos) what.remove_prefix(close + 2);
  }
  return OnOneLine(what, kMaxQuotedBytes);
}

// Parses `text` as JSON, refusing duplicate keys in any object (a header naming one tensor twice,
// or giving one tensor two dtypes, is lying about one of them; nlohmann would silently keep the
// last, the reference parser refuses) and nesting beyond kMaxJsonDepth. Never throws; `what` names
// the document.
StatusOr<Json> ParseJsonStrict(std::string_view text, const std::string& what) {
  if (const size_t bad = FirstInvalidUtf8(text); bad != std::string_view::npos) {
    return DataLossError(what + " is not valid UTF-8 (byte " + std::to_string(bad) + ")");
  }
  std::vector<std::set<std::string, std::less<>>> open_objects;  // keys seen, per enclosing object
  std::string duplicate;
  int duplicate_depth = 0;
  const Json::parser_callback_t callback = [&](int depth, Json::parse_event_t event, Json& parsed) {
    if (depth > kMaxJsonDepth) throw JsonTooDeep{};
    if (event == Json::parse_event_t::object_start) {
      open_objects.emplace_back();
    } else if (event == Json::parse_event_t::object_end) {
      if (!open_objects.empty()) open_objects.pop_back();
    } else if (event == Json::parse_event_t::key && !open_objects.empty()) {
      const auto& key = parsed.get_ref<const std::string&>();
      if (!open_objects.back().insert(key).second && duplicate.empty()) {
        duplicate = key;
        duplicate_depth = depth;
      }
    }
    return true;
  };
  try {
    Json value = Json::parse(text.begin(), text.end(), callback);
    if (!duplicate.empty()) {
      return DataLossError(what + (duplicate_depth == 1 ? " names '" : " repeats the key '") +
                           OnOneLine(duplicate, kMaxQuotedBytes) + "'" +
                           (duplicate_depth == 1 ? " twice" : " within one object"));
    }
    return value;
  } catch (const JsonTooDeep&) {
    return DataLossError(what + " nests deeper than " + std::to_string(kMaxJsonDepth) + " levels");
  } catch (const Json::exception& e) {
    return DataLossError(what + " is not valid JSON: " + JsonErrorText(e));
  } catch (const std::bad_alloc&) {
    return ResourceExhaustedError(what + " is too large to parse");
  }
}

const char* JsonTypeName(const Json& v) { return v.type_name(); }

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

  const Json& shape = entry["shape"];
  if (!shape.is_array()) {
    return DataLossError(context + ": 'shape' must be an array, got " + JsonTypeName(shape));
  }
  // Checked multiplication: a lying shape such as [2^40, 2^40] must not wrap to a small byte count
  // that happens to match the offsets.
  uint64_t bytes = DTypeSize(*parsed_dtype);
  bool overflow = false;
  std::vector<int64_t> dims;
  dims.reserve(shape.size());
  for (const Json& d : shape) {
    ASSIGN_OR_RETURN(const uint64_t dim, NonNegativeInt(d, context, "'shape'"));
    dims.push_back(static_cast<int64_t>(dim));
    uint64_t product;
    if (__builtin_mul_overflow(bytes, dim, &product)) overflow = true;
    bytes = product;
  }
  if (overflow || bytes > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
    return DataLossError(context + ": shape " + ShapeString(dims) +
                         " overflows a 64-bit byte count");
  }

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
  if (end - begin != bytes) {
    return DataLossError(context + ": shape " + ShapeString(dims) + " of " +
                         std::string(DTypeName(*parsed_dtype)) + " needs " + std::to_string(bytes) +
                         " bytes but data_offsets [" + std::to_string(begin) + ", " +
                         std::to_string(end) + "] hold " + std::to_string(end - begin));
  }
  *out = ParsedEntry{name, *parsed_dtype, std::move(dims), begin, end};
  return Status::Ok();
}
}  // namespace

// Position of each dtype in the reference implementation's Dtype enum (BOOL < U8 < I8 < I16 < F16 <
// BF16 < I32 < F32 < F64 < I64, other members omitted), which its writer sorts by.
int ReferenceRank(DType dtype) {
  switch (dtype) {
    case DType::kBool:
      return 0;
    case DType::kU8:
      return 1;
    case DType::kI8:
      return 2;
    case DType::kI16:
      return 3;
    case DType::kF16:
      return 4;
    case DType::kBF16:
      return 5;
    case DType::kI32:
      return 6;
    case DType::kF32:
      return 7;
    case DType::kF64:
      return 8;
    case DType::kI64:
      return 9;
  }
  return 0;
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

// InvalidArgument unless every tensor has a name of its own that is valid UTF-8 and not the
// metadata's, and as many bytes as its shape and dtype need, and the metadata is valid UTF-8.
Status CheckTensorsToWrite(const std::string& path, const std::vector<TensorToWrite>& tensors,
                           const std::map<std::string, std::string>& metadata) {
  std::set<std::string_view> names;
  for (const TensorToWrite& t : tensors) {
    const std::string context = path + ": tensor '" + OnOneLine(t.name, kMaxQuotedBytes) + "'";
    if (t.name == "__metadata__") {
      return InvalidArgumentError(context + ": the name is reserved for the metadata");
    }
    if (FirstInvalidUtf8(t.name) != std::string_view::npos) {
      return InvalidArgumentError(context + ": the name is not valid UTF-8");
    }
    if (!names.insert(t.name).second) return InvalidArgumentError(context + ": written twice");
    uint64_t bytes = DTypeSize(t.dtype);
    for (int64_t d : t.shape) {
      if (d < 0) {
        return InvalidArgumentError(context + ": negative dimension in shape " +
                                    ShapeString(t.shape));
      }
      if (__builtin_mul_overflow(bytes, static_cast<uint64_t>(d), &bytes)) {
        return InvalidArgumentError(context + ": shape " + ShapeString(t.shape) + " overflows");
      }
    }
    if (bytes != t.bytes.size()) {
      return InvalidArgumentError(
          context + ": shape " + ShapeString(t.shape) + " of " + std::string(DTypeName(t.dtype)) +
          " needs " + std::to_string(bytes) + " bytes, got " + std::to_string(t.bytes.size()));
    }
  }
  for (const auto& [key, value] : metadata) {
    if (FirstInvalidUtf8(key) != std::string_view::npos ||
        FirstInvalidUtf8(value) != std::string_view::npos) {
      return InvalidArgumentError(path + ": metadata '" + OnOneLine(key, kMaxQuotedBytes) +
                                  "' is not valid UTF-8");
    }
  }
  return Status::Ok();
}

// The reference writer's order: by its dtype enum, descending, then by name. That enum runs by
// element size, so with the buffer starting at a multiple of 8 every tensor starts at a multiple
// of its element size; matching its tie order as well makes our files byte-identical to Python's
// for the same input.
std::vector<const TensorToWrite*> ReferenceOrder(const std::vector<TensorToWrite>& tensors) {
  std::vector<const TensorToWrite*> order;
  order.reserve(tensors.size());
  for (const TensorToWrite& t : tensors) order.push_back(&t);
  std::sort(order.begin(), order.end(), [](const TensorToWrite* a, const TensorToWrite* b) {
    if (ReferenceRank(a->dtype) != ReferenceRank(b->dtype)) {
      return ReferenceRank(a->dtype) > ReferenceRank(b->dtype);
    }
    return a->name < b->name;
  });
  return order;
}

// The header of the tensors in `order` with `metadata`, unpadded.
StatusOr<std::string> WrittenHeader(const std::string& path,
                                    const std::vector<const TensorToWrite*>& order,
                                    const std::map<std::string, std::string>& metadata) {
  try {
    nlohmann::ordered_json header = nlohmann::ordered_json::object();
    if (!metadata.empty()) {
      nlohmann::ordered_json meta = nlohmann::ordered_json::object();
      for (const auto& [key, value] : metadata) meta[key] = value;
      header["__metadata__"] = std::move(meta);
    }
    uint64_t offset = 0;
    for (const TensorToWrite* t : order) {
      nlohmann::ordered_json entry = nlohmann::ordered_json::object();
      entry["dtype"] = DTypeName(t->dtype);
      entry["shape"] = t->shape;
      entry["data_offsets"] = {offset, offset + t->bytes.size()};
      header[t->name] = std::move(entry);
      offset += t->bytes.size();
    }
    return header.dump();
  } catch (const nlohmann::json::exception& e) {
    return InternalError(path + ": cannot build the header: " + JsonErrorText(e));
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

Status WriteSafetensors(const std::string& path, const std::vector<TensorToWrite>& tensors,
                        const std::map<std::string, std::string>& metadata) {
  RETURN_IF_ERROR(CheckTensorsToWrite(path, tensors, metadata));
  const std::vector<const TensorToWrite*> order = ReferenceOrder(tensors);
  ASSIGN_OR_RETURN(std::string header_text, WrittenHeader(path, order, metadata));
  header_text.append((8 - header_text.size() % 8) % 8, ' ');
  const uint64_t header_len = header_text.size();

  return WriteFileAtomically(path, [&](int fd) -> Status {
    RETURN_IF_ERROR(WriteAll(fd, &header_len, 8));
    RETURN_IF_ERROR(WriteAll(fd, header_text.data(), header_text.size()));
    for (const TensorToWrite* t : order)
      RETURN_IF_ERROR(WriteAll(fd, t->bytes.data(), t->bytes.size()));
    return Status::Ok();
  });
}

StatusOr<std::unique_ptr<ShardedCheckpoint>> ShardedCheckpoint::Open(const std::string& dir,
                                                                     Reading reading) {
  std::error_code ec;
  if (!std::filesystem::is_directory(dir, ec)) {
    return NotFoundError(dir + " is not a directory");
  }
  const std::string single = (std::filesystem::path(dir) / "model.safetensors").string();
  if (std::filesystem::exists(single, ec)) return OpenFile(single, reading);
  const std::string index = (std::filesystem::path(dir) / "model.safetensors.index.json").string();
  if (std::filesystem::exists(index, ec)) return OpenIndex(index, reading);
  return NotFoundError(dir + " has neither model.safetensors nor model.safetensors.index.json");
}

StatusOr<std::unique_ptr<ShardedCheckpoint>> ShardedCheckpoint::OpenFile(const std::string& path,
                                                                         Reading reading) {
  std::unique_ptr<ShardedCheckpoint> ckpt(new ShardedCheckpoint());
  ASSIGN_OR_RETURN(std::unique_ptr<SafetensorsFile> file, SafetensorsFile::Open(path, reading));
  for (const TensorView& t : file->tensors()) ckpt->by_name_.emplace(t.name, &t);
  ckpt->metadata_ = file->metadata();
  ckpt->shards_.push_back(std::move(file));
  for (const auto& [name, view] : ckpt->by_name_) ckpt->names_.push_back(name);
  return ckpt;
}

StatusOr<std::unique_ptr<ShardedCheckpoint>> ShardedCheckpoint::OpenIndex(
    const std::string& index_path, Reading reading) {
  ASSIGN_OR_RETURN(const std::string text, ReadFileToString(index_path, kMaxHeaderBytes));
  ASSIGN_OR_RETURN(const Json index, ParseJsonStrict(text, index_path));
  if (!index.is_object()) {
    return DataLossError(index_path + ": must be a JSON object, got " + JsonTypeName(index));
  }
  if (!index.contains("weight_map")) return DataLossError(index_path + ": missing 'weight_map'");
  const Json& weight_map = index["weight_map"];
  if (!weight_map.is_object()) {
    return DataLossError(index_path + ": 'weight_map' must be an object, got " +
                         JsonTypeName(weight_map));
  }
  if (weight_map.empty()) return DataLossError(index_path + ": 'weight_map' is empty");

  std::unique_ptr<ShardedCheckpoint> ckpt(new ShardedCheckpoint());
  if (index.contains("metadata") && !index["metadata"].is_null()) {
    const Json& meta = index["metadata"];
    if (!meta.is_object()) {
      return DataLossError(index_path + ": 'metadata' must be an object, got " +
                           JsonTypeName(meta));
    }
    for (const auto& [key, value] : meta.items()) {
      ckpt->metadata_[key] = value.is_string() ? value.get<std::string>() : value.dump();
    }
  }

  const std::filesystem::path dir = std::filesystem::path(index_path).parent_path();
  std::map<std::string, size_t> shard_index;  // shard file name → shards_ position
  for (const auto& [tensor, shard_json] : weight_map.items()) {
    const std::string context =
        index_path + ": tensor '" + OnOneLine(tensor, kMaxQuotedBytes) + "'";
    if (!shard_json.is_string()) {
      return DataLossError(context + ": shard must be a file name, got " +
                           JsonTypeName(shard_json));
    }
    const std::string& shard = shard_json.get_ref<const std::string&>();
    // Shards live beside the index; a path elsewhere is a broken or hostile index, not a layout we
    // know.
    if (shard.empty() || shard == "." || shard == ".." || shard.find('/') != std::string::npos ||
        shard.find('\\') != std::string::npos) {
      return DataLossError(context + ": shard '" + OnOneLine(shard, kMaxQuotedBytes) +
                           "' must be a plain file name in the index's directory");
    }
    auto it = shard_index.find(shard);
    if (it == shard_index.end()) {
      const std::string shard_path = (dir / shard).string();
      StatusOr<std::unique_ptr<SafetensorsFile>> file = SafetensorsFile::Open(shard_path, reading);
      if (!file.ok()) {
        if (file.status().code() == StatusCode::kNotFound) {
          return NotFoundError(context + ": shard file " + shard_path + " does not exist");
        }
        return file.status();
      }
      it = shard_index.emplace(shard, ckpt->shards_.size()).first;
      ckpt->shards_.push_back(std::move(*file));
    }
    const TensorView* view = ckpt->shards_[it->second]->Find(tensor);
    if (view == nullptr) {
      return DataLossError(context + " is listed in shard '" + OnOneLine(shard, kMaxQuotedBytes) +
                           "' but that file has no such tensor");
    }
    ckpt->by_name_.emplace(tensor, view);
  }
  for (const auto& [name, view] : ckpt->by_name_) ckpt->names_.push_back(name);
  return ckpt;
}

const TensorView* ShardedCheckpoint::Find(std::string_view name) const {
  const auto it = by_name_.find(name);
  return it == by_name_.end() ? nullptr : it->second;
}

}  // namespace llmctl::safetensors
