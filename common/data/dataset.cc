#include "common/data/dataset.h"

#include <algorithm>
#include <functional>
#include <nlohmann/json.hpp>

#include "common/data/file_util.h"
#include "common/text.h"

namespace llmctl::data {
namespace {

using Json = nlohmann::json;

constexpr std::string_view kAlpacaWithInput =
    "Below is an instruction that describes a task, paired with an input that provides further "
    "context. Write a response that appropriately completes the request.\n\n"
    "### Instruction:\n{instruction}\n\n### Input:\n{input}\n\n### Response:\n";
constexpr std::string_view kAlpacaNoInput =
    "Below is an instruction that describes a task. Write a response that appropriately completes "
    "the request.\n\n### Instruction:\n{instruction}\n\n### Response:\n";

// Replaces each "{name}" once; values are inserted verbatim (a "{input}" inside an instruction
// stays).
std::string Fill(std::string_view pattern, std::string_view instruction, std::string_view input) {
  std::string out;
  out.reserve(pattern.size() + instruction.size() + input.size());
  while (!pattern.empty()) {
    const size_t open = pattern.find('{');
    if (open == std::string_view::npos) {
      out += pattern;
      break;
    }
    out += pattern.substr(0, open);
    pattern.remove_prefix(open);
    if (pattern.starts_with("{instruction}")) {
      out += instruction;
      pattern.remove_prefix(std::string_view("{instruction}").size());
    } else if (pattern.starts_with("{input}")) {
      out += input;
      pattern.remove_prefix(std::string_view("{input}").size());
    } else {
      out += '{';
      pattern.remove_prefix(1);
    }
  }
  return out;
}

// "parse error at line 1, column 7: syntax error while parsing ..." → "column 7: syntax error ...":
// each line is parsed alone, so nlohmann's "line 1" would contradict the file line we report. The
// text quotes what the parser last read, the user's bytes: it may stop inside a character ("last
// read: '{\xE2'" for "{€") and may hold controls a terminal acts on, so it goes through OnOneLine,
// cut to 200 bytes.
std::string JsonErrorText(const Json::exception& e) {
  std::string_view what = e.what();
  const size_t column = what.find("column ");
  if (column != std::string_view::npos) {
    what.remove_prefix(column);
  } else if (const size_t close = what.find("] "); close != std::string_view::npos) {
    what.remove_prefix(close + 2);
  }
  return OnOneLine(what, 200);
}

// A required (or, with `optional`, absent/null → "") string field.
Status GetString(const Json& object, const char* field, bool optional, const std::string& where,
                 std::string* out) {
  const auto it = object.find(field);
  if (it == object.end() || it->is_null()) {
    if (optional) {
      out->clear();
      return Status::Ok();
    }
    return InvalidArgumentError(where + ": missing field '" + field + "'");
  }
  if (!it->is_string()) {
    return InvalidArgumentError(where + ": field '" + field + "' must be a string, got " +
                                it->type_name());
  }
  *out = it->get<std::string>();
  return Status::Ok();
}

// JSON Lines fed in pieces of any size, each line parsed when its LF arrives (the last one at
// Finish): a file is read holding one line, never the whole of it.
class JsonlReader {
 public:
  JsonlReader(std::string_view file_name, DatasetFormat format,
              std::function<Status(Record record)> on_record)
      : file_name_(file_name), format_(format), on_record_(std::move(on_record)) {}

  // The next bytes of the input; a line may continue in the next call.
  Status Add(std::string_view bytes) {
    while (!bytes.empty()) {
      const size_t newline = bytes.find('\n');
      const std::string_view part = bytes.substr(0, newline);
      if (partial_line_.size() + part.size() > kMaxJsonlLineBytes) return LineTooLong();
      if (newline == std::string_view::npos) {
        partial_line_.append(part);
        return Status::Ok();
      }
      bytes.remove_prefix(newline + 1);
      if (partial_line_.empty()) {
        RETURN_IF_ERROR(ParseLine(part));
      } else {
        partial_line_.append(part);
        RETURN_IF_ERROR(ParseLine(partial_line_));
        partial_line_.clear();
      }
    }
    return Status::Ok();
  }

  // The end of the input: its last line when no LF ends it, and the refusal of an input without
  // records.
  Status Finish() {
    if (!partial_line_.empty()) {
      RETURN_IF_ERROR(ParseLine(partial_line_));
      partial_line_.clear();
    }
    if (records_ == 0) {
      return InvalidArgumentError(file_name_ +
                                  ": no examples (the file is empty or holds only blank lines)");
    }
    return Status::Ok();
  }

 private:
  Status LineTooLong() const {
    return InvalidArgumentError(
        std::string(file_name_)
            .append(":")
            .append(std::to_string(line_number_ + 1))
            .append(": the line is longer than ")
            .append(std::to_string(kMaxJsonlLineBytes >> 20))
            .append(" MiB, the most one record may take (JSON Lines holds one record a line, each "
                    "ending in LF)"));
  }

  Status ParseLine(std::string_view line) {
    ++line_number_;
    if (line_number_ == 1 && line.starts_with("\xEF\xBB\xBF")) {
      line.remove_prefix(3);  // editors on Windows add a BOM
    }
    if (line.ends_with('\r')) line.remove_suffix(1);
    if (line.find_first_not_of(" \t") == std::string_view::npos) return Status::Ok();
    const std::string where = file_name_ + ":" + std::to_string(line_number_);
    if (const size_t bad = FirstInvalidUtf8(line); bad != std::string_view::npos) {
      return InvalidArgumentError(where + ": invalid UTF-8 at column " + std::to_string(bad + 1));
    }
    Json value;
    try {
      value = Json::parse(line);
    } catch (const Json::exception& e) {
      // A CR alone is JSON whitespace, so a file whose lines end in it (classic Mac OS) reads as
      // one line and fails at its second record: say so, not where the parser stopped.
      if (const size_t cr = line.find('\r'); cr != std::string_view::npos) {
        return InvalidArgumentError(
            where + ": a carriage return without a line feed at column " + std::to_string(cr + 1) +
            " and the line is not one JSON object: JSON Lines records end in LF or CRLF, not in "
            "CR alone (classic Mac OS line ends); convert the file's line ends to LF");
      }
      return InvalidArgumentError(where + ": invalid JSON at " + JsonErrorText(e));
    }
    if (!value.is_object()) {
      return InvalidArgumentError(where + ": expected a JSON object, got " + value.type_name());
    }
    Record record;
    record.line = line_number_;
    if (format_ == DatasetFormat::kAlpaca) {
      RETURN_IF_ERROR(GetString(value, "instruction", false, where, &record.instruction));
      RETURN_IF_ERROR(GetString(value, "input", true, where, &record.input));
      RETURN_IF_ERROR(GetString(value, "output", false, where, &record.output));
    } else {
      RETURN_IF_ERROR(GetString(value, "text", false, where, &record.text));
    }
    ++records_;
    return on_record_(std::move(record));
  }

  const std::string file_name_;
  const DatasetFormat format_;
  const std::function<Status(Record record)> on_record_;
  std::string partial_line_;  // the bytes of a line whose LF has not arrived yet
  int64_t line_number_ = 0;   // of the last line parsed, 1-based
  int64_t records_ = 0;
};

}  // namespace

StatusOr<DatasetFormat> ParseDatasetFormat(std::string_view name) {
  if (name == "alpaca") return DatasetFormat::kAlpaca;
  if (name == "text") return DatasetFormat::kText;
  return InvalidArgumentError("unknown dataset format '" + std::string(name) +
                              "' (expected 'alpaca' or 'text')");
}

std::string_view DatasetFormatName(DatasetFormat format) {
  return format == DatasetFormat::kAlpaca ? "alpaca" : "text";
}

StatusOr<PromptTemplate> ParsePromptTemplate(std::string_view name) {
  if (name == "alpaca") return PromptTemplate::kAlpaca;
  if (name == "none") return PromptTemplate::kNone;
  return InvalidArgumentError("unknown prompt template '" + std::string(name) +
                              "' (expected 'alpaca' or 'none')");
}

std::string_view PromptTemplateName(PromptTemplate prompt_template) {
  return prompt_template == PromptTemplate::kAlpaca ? "alpaca" : "none";
}

StatusOr<std::vector<Record>> ParseJsonl(std::string_view content, std::string_view file_name,
                                         DatasetFormat format) {
  std::vector<Record> records;
  JsonlReader reader(file_name, format, [&](Record record) {
    records.push_back(std::move(record));
    return Status::Ok();
  });
  RETURN_IF_ERROR(reader.Add(content));
  RETURN_IF_ERROR(reader.Finish());
  return records;
}

Status ForEachJsonlRecord(const std::string& path, DatasetFormat format,
                          const std::function<Status(Record record)>& on_record,
                          uint64_t* content_hash) {
  JsonlReader reader(path, format, on_record);
  uint64_t hash = kFnv1a64Offset;
  RETURN_IF_ERROR(ReadFileInPieces(path, [&](std::string_view piece) {
    hash = Fnv1a64(piece, hash);
    return reader.Add(piece);
  }));
  RETURN_IF_ERROR(reader.Finish());
  if (content_hash != nullptr) *content_hash = hash;
  return Status::Ok();
}

StatusOr<std::vector<Record>> LoadJsonl(const std::string& path, DatasetFormat format) {
  std::vector<Record> records;
  RETURN_IF_ERROR(ForEachJsonlRecord(path, format, [&](Record record) {
    records.push_back(std::move(record));
    return Status::Ok();
  }));
  return records;
}

StatusOr<PromptAndResponse> RenderExample(const Record& record, DatasetFormat format,
                                          PromptTemplate prompt_template) {
  if (format == DatasetFormat::kText) {
    if (prompt_template != PromptTemplate::kNone) {
      return InvalidArgumentError("prompt template '" +
                                  std::string(PromptTemplateName(prompt_template)) +
                                  "' needs dataset format 'alpaca'; format 'text' takes template "
                                  "'none'");
    }
    return PromptAndResponse{"", record.text};
  }
  if (prompt_template == PromptTemplate::kAlpaca) {
    return PromptAndResponse{Fill(record.input.empty() ? kAlpacaNoInput : kAlpacaWithInput,
                                  record.instruction, record.input),
                             record.output};
  }
  std::string prompt = record.instruction;
  if (!record.input.empty()) prompt += "\n\n" + record.input;
  prompt += "\n";
  return PromptAndResponse{std::move(prompt), record.output};
}

StatusOr<TokenizedExample> TokenizeExample(const TextEncoder& encoder,
                                           const PromptAndResponse& example,
                                           const ExampleOptions& options) {
  if (options.max_seq_length < 2) {
    return InvalidArgumentError("max_seq_length must be at least 2, got " +
                                std::to_string(options.max_seq_length));
  }
  ASSIGN_OR_RETURN(const std::vector<int32_t> full,
                   encoder.Encode(example.prompt + example.response, false));
  size_t prompt_tokens = 0;
  if (options.mask_prompt && !example.prompt.empty()) {
    ASSIGN_OR_RETURN(const std::vector<int32_t> prompt, encoder.Encode(example.prompt, false));
    prompt_tokens = std::min(prompt.size(), full.size());
  }

  TokenizedExample out;
  out.input_ids.reserve(full.size() + 2);
  size_t masked = 0;
  if (encoder.bos_id() >= 0) {
    out.input_ids.push_back(encoder.bos_id());
    if (options.mask_prompt) masked = 1;
  }
  masked += prompt_tokens;
  out.input_ids.insert(out.input_ids.end(), full.begin(), full.end());
  if (encoder.eos_id() >= 0) out.input_ids.push_back(encoder.eos_id());
  for (int32_t id : out.input_ids) {
    if (id < 0) {
      return InternalError("the tokenizer returned a negative token id " + std::to_string(id));
    }
  }

  out.labels = out.input_ids;
  std::fill_n(out.labels.begin(), masked, kIgnoreIndex);
  if (out.input_ids.size() > static_cast<size_t>(options.max_seq_length)) {
    out.input_ids.resize(options.max_seq_length);
    out.labels.resize(options.max_seq_length);
    out.truncated = true;
  }
  return out;
}

}  // namespace llmctl::data
