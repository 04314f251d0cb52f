#include "common/image/imagefolder.h"

#include <filesystem>
#include <nlohmann/json.hpp>
#include <set>
#include <string_view>
#include <system_error>

#include "common/files.h"
#include "common/foreign_json.h"
#include "common/image/image.h"
#include "common/text.h"

namespace llmctl::image {
namespace {

namespace fs = std::filesystem;

// The longest file_name a message repeats whole.
constexpr size_t kMaxNamed = 200;

// One metadata row: its line (1-based, where the row starts) and its columns.
struct Row {
  int line = 0;
  nlohmann::json fields;
};

// "where:line: invalid UTF-8 at column N" for the first byte of `text` (starting at `first_line`)
// that breaks UTF-8, or OK. Lines end at LF, and with `lone_cr_ends_line` at a CR alone too, as
// each reader counts them. Captions go to the tokenizer, whose refusal of text that is not UTF-8
// names no file, so the metadata is refused here with its line, as the datasets library refuses it
// (and ParseJsonl a dataset's line).
Status CheckUtf8(std::string_view text, const std::string& where, int first_line,
                 bool lone_cr_ends_line) {
  const size_t bad = FirstInvalidUtf8(text);
  if (bad == std::string_view::npos) return Status::Ok();
  int line = first_line;
  size_t line_start = 0;
  for (size_t i = 0; i < bad; ++i) {
    if (text[i] == '\n' || (lone_cr_ends_line && text[i] == '\r' && text[i + 1] != '\n')) {
      ++line;
      line_start = i + 1;
    }
  }
  return InvalidArgumentError(where + ":" + std::to_string(line) + ": invalid UTF-8 at column " +
                              std::to_string(bad - line_start + 1));
}

StatusOr<std::vector<Row>> ReadJsonLines(std::string_view text, const std::string& where) {
  std::vector<Row> rows;
  int line = 0;
  size_t start = 0;
  while (start < text.size()) {
    const size_t end = std::min(text.find('\n', start), text.size());
    const std::string_view content(text.data() + start, end - start);
    ++line;
    start = end + 1;
    if (content.find_first_not_of(" \t\r") == std::string_view::npos) continue;
    // Said as such: the JSON parser's refusal would read "not a JSON object".
    RETURN_IF_ERROR(CheckUtf8(content, where, line, /*lone_cr_ends_line=*/false));
    nlohmann::json row = ParseForeignJson(content);
    if (row.is_discarded() || !row.is_object()) {
      return InvalidArgumentError(where + ":" + std::to_string(line) + ": not a JSON object");
    }
    rows.push_back({line, std::move(row)});
  }
  return rows;
}

// RFC 4180: fields separated by commas, records by CRLF or LF; a quoted field may hold commas,
// line breaks and doubled quotes. The first record names the columns.
StatusOr<std::vector<Row>> ReadCsv(std::string_view text, const std::string& where) {
  // Before the fields are split: a quoted field's line breaks are the file's lines too.
  RETURN_IF_ERROR(CheckUtf8(text, where, 1, /*lone_cr_ends_line=*/true));
  std::vector<std::vector<std::string>> records;
  std::vector<int> lines;
  std::vector<std::string> record;
  std::string field;
  bool quoted = false, field_started = false;
  int line = 1, record_line = 1;
  auto end_record = [&] {
    record.push_back(std::move(field));
    field.clear();
    if (!(record.size() == 1 && record[0].empty() && !field_started)) {
      records.push_back(std::move(record));
      lines.push_back(record_line);
    }
    record.clear();
    field_started = false;
  };
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (quoted) {
      if (c == '"' && i + 1 < text.size() && text[i + 1] == '"') {
        field += '"';
        ++i;
      } else if (c == '"') {
        quoted = false;
      } else {
        if (c == '\n') ++line;
        field += c;
      }
    } else if (c == '"' && field.empty()) {
      quoted = field_started = true;
    } else if (c == ',') {
      record.push_back(std::move(field));
      field.clear();
      field_started = true;
    } else if (c == '\n' || c == '\r') {
      if (c == '\r' && i + 1 < text.size() && text[i + 1] == '\n') ++i;
      end_record();
      record_line = ++line;
    } else {
      field += c;
      field_started = true;
    }
  }
  if (quoted)
    return InvalidArgumentError(where + ":" + std::to_string(record_line) +
                                ": a quote is never closed");
  if (field_started || !field.empty() || !record.empty()) end_record();
  if (records.empty()) return InvalidArgumentError(where + ": no header row");
  std::vector<Row> rows;
  const std::vector<std::string>& header = records[0];
  for (size_t r = 1; r < records.size(); ++r) {
    if (records[r].size() != header.size()) {
      return InvalidArgumentError(where + ":" + std::to_string(lines[r]) + ": " +
                                  std::to_string(records[r].size()) +
                                  " fields where the header has " + std::to_string(header.size()));
    }
    Row row{lines[r], nlohmann::json::object()};
    for (size_t c = 0; c < header.size(); ++c) row.fields[header[c]] = records[r][c];
    rows.push_back(std::move(row));
  }
  return rows;
}

}  // namespace

StatusOr<std::vector<CaptionedImage>> ReadImageFolder(const std::string& folder,
                                                      const std::string& display_folder,
                                                      const std::string& caption_column) {
  const fs::path dir(folder);
  // The error_code overloads throughout: a path the user or the metadata wrote may be one the
  // system refuses to look up (a 5,000-character name: ENAMETOOLONG), which is theirs to hear of.
  std::error_code error;
  const bool has_jsonl = fs::exists(dir / "metadata.jsonl", error);
  const bool has_csv = fs::exists(dir / "metadata.csv", error);
  if (has_jsonl && has_csv) {
    return InvalidArgumentError(display_folder +
                                ": both metadata.jsonl and metadata.csv; keep one");
  }
  if (!has_jsonl && !has_csv) {
    return NotFoundError(display_folder +
                         ": no metadata.jsonl or metadata.csv (an imagefolder names each image's "
                         "file_name and caption there)");
  }
  const std::string name = has_jsonl ? "metadata.jsonl" : "metadata.csv";
  const std::string where = (fs::path(display_folder) / name).string();
  // COCO's 600,000 captions take about 60 MB; a metadata file is parsed into rows of many times
  // its size, so one past this is refused before it is read.
  constexpr size_t kMaxMetadataBytes = size_t{256} << 20;
  ASSIGN_OR_RETURN(const std::string content,
                   ReadFileToString((dir / name).string(), kMaxMetadataBytes));
  // Excel's "CSV UTF-8" and Windows' Notepad start a file with a byte-order mark, which the
  // datasets library skips. Kept, it would be part of a CSV header's first column (every row then
  // lacking its file_name), and a line of its own in JSON Lines would not be blank.
  std::string_view text = content;
  if (text.starts_with("\xEF\xBB\xBF")) text.remove_prefix(3);
  ASSIGN_OR_RETURN(const std::vector<Row> rows,
                   has_jsonl ? ReadJsonLines(text, where) : ReadCsv(text, where));
  if (rows.empty()) return InvalidArgumentError(where + ": no rows");
  const fs::path root = fs::weakly_canonical(dir, error);
  if (error) return InvalidArgumentError(display_folder + ": " + error.message());
  std::vector<CaptionedImage> images;
  std::set<std::string> seen;
  for (const Row& row : rows) {
    const std::string at = where + ":" + std::to_string(row.line) + ": ";
    const auto file = row.fields.find("file_name");
    if (file == row.fields.end() || !file->is_string() || file->get<std::string>().empty()) {
      return InvalidArgumentError(at + "no file_name");
    }
    const auto caption = row.fields.find(caption_column);
    if (caption == row.fields.end()) {
      return InvalidArgumentError(at + "no caption column '" + caption_column + "'");
    }
    if (!caption->is_string() ||
        caption->get<std::string>().find_first_not_of(" \t\r\n") == std::string::npos) {
      return InvalidArgumentError(at + "the caption ('" + caption_column +
                                  "') is empty or not text");
    }
    const std::string file_name = file->get<std::string>();
    // Named in messages by its first kMaxNamed bytes: it is the metadata's, of any length.
    const std::string named = file_name.size() > kMaxNamed
                                  ? file_name.substr(0, kMaxNamed) + "... (" +
                                        std::to_string(file_name.size()) + " bytes)"
                                  : file_name;
    // The system reads a path up to its first NUL: one inside would name another file.
    if (file_name.find('\0') != std::string::npos) {
      return InvalidArgumentError(at + "file_name '" + named.substr(0, named.find('\0')) +
                                  "...' holds a NUL byte");
    }
    const fs::path path = fs::weakly_canonical(dir / file_name, error);
    if (error) {
      return InvalidArgumentError(at + "file_name '" + named + "': " + error.message());
    }
    const auto [outside, unused] =
        std::mismatch(root.begin(), root.end(), path.begin(), path.end());
    if (fs::path(file_name).is_absolute() || outside != root.end()) {
      return InvalidArgumentError(at + "file_name '" + named + "' is outside the folder");
    }
    // As written, not `path`: past the first component that does not exist, weakly_canonical
    // resolves ".." by the text ("nowhere/../a.jpg" is "a.jpg"), where the system, opening
    // folder/file_name, finds no "nowhere" and fails.
    if (!fs::is_regular_file(dir / file_name, error)) {
      return InvalidArgumentError(at + "file_name '" + named + "': no such file in " +
                                  display_folder);
    }
    if (!seen.insert(path.string()).second) {
      return InvalidArgumentError(at + "file_name '" + named + "' is listed twice");
    }
    images.push_back({file_name, (dir / file_name).string(), caption->get<std::string>()});
  }
  return images;
}

Status CheckImages(const std::vector<CaptionedImage>& images, const std::string& display_folder) {
  for (const CaptionedImage& image : images) {
    RETURN_IF_ERROR(
        DecodeImageFile(image.path, (fs::path(display_folder) / image.file_name).string())
            .status());
  }
  return Status::Ok();
}

}  // namespace llmctl::image
