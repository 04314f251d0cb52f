#include <algorithm>
#include <bit>
#include <nlohmann/json.hpp>
#include <set>

#include "common/atomic_file.h"
#include "common/safetensors/safetensors.h"
#include "common/safetensors/strict_json.h"
#include "common/text.h"

namespace llmctl::safetensors {
namespace {

static_assert(std::endian::native == std::endian::little,
              "safetensors stores little-endian data; the header length is written as its bytes");

using internal::JsonErrorText;
using internal::kMaxQuotedBytes;

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
}

}  // namespace

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

}  // namespace llmctl::safetensors
