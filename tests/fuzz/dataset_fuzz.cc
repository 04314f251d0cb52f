// Fuzz target for the user's training data as llmctl and llm-train read it: a JSON Lines dataset
// (common/data/dataset.h: ParseJsonl for each DatasetFormat, then RenderExample through each prompt
// template and TokenizeExample) and an imagefolder caption set's metadata.jsonl or metadata.csv
// (common/image/imagefolder.h: ReadImageFolder, on a scratch folder holding a few empty images).
//
// The input's first byte chooses: bits 0-1 the parser (0: ParseJsonl alpaca, 1: ParseJsonl text,
// 2: metadata.jsonl, 3: metadata.csv); bit 2 mask_prompt for TokenizeExample, and the caption
// column
// ("text" when clear, "caption" when set); bits 3-7 max_seq_length (2 + 4 * value). The rest is the
// file's content.
//
// Beyond "no crash, no exception, no hang", each parser's promises from its header:
// - ParseJsonl: an independent reading of the same bytes (the BOM dropped, lines split at '\n', one
//   '\r' before it dropped, lines of spaces and tabs skipped, each line strict UTF-8, a JSON object
//   with the format's fields as strings, "input" absent or null as "") agrees with it: the same
//   record count, each record's 1-based line and fields, or an InvalidArgument whose message starts
//   "<file name>:<line of the first bad line>: " (": no examples" when nothing is left). A message
//   is one line of valid UTF-8 and short. The same content with CRLF line ends, and with a UTF-8
//   byte-order mark, reads to the same records.
// - ParseDatasetFormat and ParsePromptTemplate accept exactly their names, which round-trip.
// - RenderExample: text records take only the "none" template (prompt "", response the text);
//   alpaca records render the Stanford Alpaca prompt (the "### Input:" block only with an input,
//   the fields inserted verbatim) or "none"'s instruction ["\n\n" input] "\n"; the response is the
//   output.
// - TokenizeExample with ByteTextEncoder: ids and labels of one length, at most max_seq_length,
//   [BOS] prompt response [EOS] cut there (truncated exactly when something was cut), labels the id
//   or -100, -100 exactly on BOS and the prompt with mask_prompt.
// - ReadImageFolder: InvalidArgument naming "<display folder>/metadata.jsonl" (or .csv), with a
// line
//   within the file's, never the folder's real path; what it accepts is a regular file inside the
//   folder, at folder/file_name, each once, with a caption that is not blank; metadata.jsonl gives
//   one entry per non-blank line. The same metadata with CRLF line ends, and with a UTF-8
//   byte-order mark (Excel's "CSV UTF-8" writes one; the datasets library skips it), reads the
//   same; a metadata.csv that is not UTF-8 is refused naming its line (its captions would otherwise
//   reach the tokenizer, whose refusal names no file).
//
// Replayed over tests/fuzz/corpus/dataset/ by the `dataset_fuzz_replay` test, with seeded
// mutations. To fuzz for real (clang with libFuzzer: apt-get install clang libclang-rt-14-dev),
// from the repository root, in bash:
//
//   SRCS="tests/fuzz/dataset_fuzz.cc
//         $(ls common/*.cc | grep -v -e _test.cc -e _main.cc -e logging.cc)
//         common/data/dataset.cc common/data/file_util.cc common/image/imagefolder.cc
//         common/image/decode.cc common/image/resample.cc"
//   clang++ -std=c++20 -g -O1 -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=all
//       -I. $SRCS $(pkg-config --cflags --libs yaml-cpp libjpeg libpng)
//       -o /tmp/dataset_fuzz                                                      # one line
//   mkdir -p /tmp/dataset_corpus
//   /tmp/dataset_fuzz -max_total_time=300 -max_len=4096 -timeout=10 -rss_limit_mb=2048
//       -dict=tests/fuzz/dataset_fuzz.dict /tmp/dataset_corpus
//       tests/fuzz/corpus/dataset                                                 # one line
//
// The scratch folder is made under $TMPDIR (else /dev/shm, else /tmp) once per process and removed
// at exit.
// Inputs that crash go into tests/fuzz/corpus/dataset/ with the fix.
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <system_error>
#include <vector>

#include "common/data/dataset.h"
#include "common/data/text_encoder.h"
#include "common/image/imagefolder.h"
#include "common/status.h"

namespace {

namespace fs = std::filesystem;
using llmctl::StatusCode;
using llmctl::StatusOr;
using llmctl::data::DatasetFormat;
using llmctl::data::PromptTemplate;
using llmctl::data::Record;
using Json = nlohmann::json;

constexpr std::string_view kFileName = "fuzz/train.jsonl";
constexpr std::string_view kDisplayFolder = "fuzz/captions";
constexpr std::string_view kBom = "\xEF\xBB\xBF";

// Aborts naming the check that failed, so a crash's report says which promise broke.
// (__builtin_LINE rather than std::source_location: clang 14 with libstdc++ 12 lacks the latter.)
void Check(bool condition, int line = __builtin_LINE()) {
  if (condition) return;
  std::fprintf(stderr, "check failed at %s:%d\n", __FILE__, line);
  std::abort();
}

// Strict UTF-8 (RFC 3629): no overlong forms, no surrogates, nothing past U+10FFFF. Written here
// rather than taken from common/text.h, so the check does not share the parser's code.
bool IsUtf8(std::string_view text) {
  size_t i = 0;
  while (i < text.size()) {
    const auto byte = [&](size_t k) { return static_cast<unsigned char>(text[k]); };
    const unsigned char c = byte(i);
    size_t length;
    unsigned char low = 0x80, high = 0xBF;
    if (c < 0x80) {
      ++i;
      continue;
    } else if (c >= 0xC2 && c <= 0xDF) {
      length = 2;
    } else if (c >= 0xE0 && c <= 0xEF) {
      length = 3;
      if (c == 0xE0) low = 0xA0;
      if (c == 0xED) high = 0x9F;
    } else if (c >= 0xF0 && c <= 0xF4) {
      length = 4;
      if (c == 0xF0) low = 0x90;
      if (c == 0xF4) high = 0x8F;
    } else {
      return false;
    }
    if (i + length > text.size()) return false;
    if (byte(i + 1) < low || byte(i + 1) > high) return false;
    for (size_t k = 2; k < length; ++k) {
      if (byte(i + k) < 0x80 || byte(i + k) > 0xBF) return false;
    }
    i += length;
  }
  return true;
}

std::string ReplaceAll(std::string_view text, std::string_view from, std::string_view to) {
  std::string out;
  for (size_t at = 0; at < text.size();) {
    if (text.substr(at).starts_with(from)) {
      out += to;
      at += from.size();
    } else {
      out += text[at++];
    }
  }
  return out;
}

// A message a user reads: one line, valid UTF-8, short (it quotes at most a bounded piece of the
// file, whatever the file's size).
void CheckMessage(const std::string& message, size_t name_bytes) {
  Check(message.find('\n') == std::string::npos);
  Check(IsUtf8(message));
  Check(message.size() <= name_bytes + 600);
}

// What ParseJsonl should make of `content`, read independently: the records, or the line of the
// first bad line (0: no records at all).
struct Expected {
  std::vector<Record> records;
  int64_t bad_line = -1;  // -1: fine; 0: no records; else the first bad line
};

Expected ReadJsonlIndependently(std::string_view content, DatasetFormat format) {
  Expected expected;
  if (content.starts_with(kBom)) content.remove_prefix(kBom.size());
  int64_t line_number = 0;
  size_t start = 0;
  while (start < content.size()) {
    ++line_number;
    size_t end = content.find('\n', start);
    if (end == std::string_view::npos) end = content.size();
    std::string_view line = content.substr(start, end - start);
    start = end + 1;
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (line.find_first_not_of(" \t") == std::string_view::npos) continue;
    expected.bad_line = line_number;  // until the line proves good
    if (!IsUtf8(line)) return expected;
    const Json value = Json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (value.is_discarded() || !value.is_object()) return expected;
    Record record;
    record.line = line_number;
    const auto field = [&](const char* name, bool optional, std::string* out) {
      const auto it = value.find(name);
      if (it == value.end() || it->is_null()) return optional;
      if (!it->is_string()) return false;
      *out = it->get<std::string>();
      return true;
    };
    const bool fields_ok = format == DatasetFormat::kAlpaca
                               ? field("instruction", false, &record.instruction) &&
                                     field("input", true, &record.input) &&
                                     field("output", false, &record.output)
                               : field("text", false, &record.text);
    if (!fields_ok) return expected;
    expected.bad_line = -1;
    expected.records.push_back(std::move(record));
  }
  if (expected.records.empty()) expected.bad_line = 0;
  return expected;
}

bool SameRecords(const std::vector<Record>& a, const std::vector<Record>& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (a[i].instruction != b[i].instruction || a[i].input != b[i].input ||
        a[i].output != b[i].output || a[i].text != b[i].text || a[i].line != b[i].line) {
      return false;
    }
  }
  return true;
}

void CheckRenderAndTokenize(const Record& record, DatasetFormat format, bool mask_prompt,
                            int64_t max_seq_length) {
  static const llmctl::data::ByteTextEncoder encoder;
  for (const PromptTemplate prompt_template : {PromptTemplate::kAlpaca, PromptTemplate::kNone}) {
    const StatusOr<llmctl::data::PromptAndResponse> rendered =
        llmctl::data::RenderExample(record, format, prompt_template);
    if (format == DatasetFormat::kText) {
      if (prompt_template == PromptTemplate::kAlpaca) {
        Check(!rendered.ok() && rendered.status().code() == StatusCode::kInvalidArgument);
        continue;
      }
      Check(rendered.ok() && rendered->prompt.empty() && rendered->response == record.text);
    } else {
      Check(rendered.ok() && rendered->response == record.output);
      const std::string& prompt = rendered->prompt;
      if (prompt_template == PromptTemplate::kNone) {
        Check(prompt ==
              record.instruction + (record.input.empty() ? "" : "\n\n" + record.input) + "\n");
      } else {
        const std::string head = "### Instruction:\n" + record.instruction + "\n\n";
        const std::string input_block =
            record.input.empty() ? "" : "### Input:\n" + record.input + "\n\n";
        const std::string tail = head + input_block + "### Response:\n";
        Check(prompt.starts_with("Below is an instruction that describes a task"));
        Check(prompt.ends_with(tail));
        // The preamble before the fields names an input exactly when there is one.
        const std::string_view preamble(prompt.data(), prompt.size() - tail.size());
        Check((preamble.find("paired with an input") != std::string_view::npos) ==
              !record.input.empty());
      }
    }

    const StatusOr<llmctl::data::TokenizedExample> example = llmctl::data::TokenizeExample(
        encoder, *rendered, llmctl::data::ExampleOptions{max_seq_length, mask_prompt});
    Check(example.ok());
    const std::string text = rendered->prompt + rendered->response;
    const size_t full = text.size() + 2;  // BOS and EOS
    const size_t kept = std::min<size_t>(full, static_cast<size_t>(max_seq_length));
    Check(example->input_ids.size() == kept && example->labels.size() == kept);
    Check(example->truncated == (full > kept));
    const size_t masked = mask_prompt ? 1 + rendered->prompt.size() : 0;
    for (size_t t = 0; t < kept; ++t) {
      const int32_t id = example->input_ids[t];
      const int32_t expected_id = t == 0             ? llmctl::data::ByteTextEncoder::kBos
                                  : t <= text.size() ? static_cast<unsigned char>(text[t - 1]) +
                                                           llmctl::data::ByteTextEncoder::kOffset
                                                     : llmctl::data::ByteTextEncoder::kEos;
      Check(id == expected_id);
      Check(example->labels[t] == (t < masked ? llmctl::data::kIgnoreIndex : id));
    }
  }
}

void FuzzJsonl(std::string_view content, DatasetFormat format, bool mask_prompt,
               int64_t max_seq_length) {
  const StatusOr<std::vector<Record>> records =
      llmctl::data::ParseJsonl(content, kFileName, format);
  const Expected expected = ReadJsonlIndependently(content, format);
  if (!records.ok()) {
    Check(records.status().code() == StatusCode::kInvalidArgument);
    const std::string& message = records.status().message();
    CheckMessage(message, kFileName.size());
    Check(expected.bad_line >= 0);
    std::string prefix(kFileName);
    if (expected.bad_line == 0) {
      prefix.append(": no examples");
    } else {
      prefix.append(":").append(std::to_string(expected.bad_line)).append(": ");
    }
    Check(message.starts_with(prefix));
  } else {
    Check(expected.bad_line == -1 && SameRecords(*records, expected.records));
    for (const Record& record : *records) {
      Check(IsUtf8(record.instruction) && IsUtf8(record.input) && IsUtf8(record.output) &&
            IsUtf8(record.text));
      CheckRenderAndTokenize(record, format, mask_prompt, max_seq_length);
    }
  }

  // The promises on line ends and a byte-order mark: the same records, or the same first bad line.
  const auto same_outcome = [&](const StatusOr<std::vector<Record>>& other) {
    if (records.ok() != other.ok()) return false;
    if (records.ok()) return SameRecords(*records, *other);
    const std::string& a = records.status().message();
    const std::string& b = other.status().message();
    return a.substr(0, a.find(": ", kFileName.size() + 1)) ==
           b.substr(0, b.find(": ", kFileName.size() + 1));
  };
  if (content.find('\r') == std::string_view::npos &&
      content.find('\n') != std::string_view::npos) {
    Check(same_outcome(
        llmctl::data::ParseJsonl(ReplaceAll(content, "\n", "\r\n"), kFileName, format)));
  }
  if (!content.starts_with(kBom)) {
    Check(same_outcome(
        llmctl::data::ParseJsonl(std::string(kBom) + std::string(content), kFileName, format)));
  }
}

// The names: exactly the documented ones parse, and they round-trip.
void FuzzNames(std::string_view content) {
  const std::string_view name = content.substr(0, std::min<size_t>(content.find('\n'), 16));
  const StatusOr<DatasetFormat> format = llmctl::data::ParseDatasetFormat(name);
  Check(format.ok() == (name == "alpaca" || name == "text"));
  if (format.ok()) Check(llmctl::data::DatasetFormatName(*format) == name);
  const StatusOr<PromptTemplate> prompt_template = llmctl::data::ParsePromptTemplate(name);
  Check(prompt_template.ok() == (name == "alpaca" || name == "none"));
  if (prompt_template.ok()) Check(llmctl::data::PromptTemplateName(*prompt_template) == name);
}

// The scratch imagefolder: a few empty "images" (ReadImageFolder does not decode them), under a
// folder of its own per process, removed at exit.
const fs::path& ScratchFolder() {
  // Never destroyed: the exit handler that removes it runs after static destructors would.
  static const fs::path* const folder = [] {
    // Each input writes the metadata (three times), so a file system in memory is a dozen times
    // faster than /tmp on a busy disk.
    const char* tmp = std::getenv("TMPDIR");
    const std::string parent = tmp != nullptr && *tmp != '\0'    ? tmp
                               : ::access("/dev/shm", W_OK) == 0 ? "/dev/shm"
                                                                 : "/tmp";
    std::string pattern = parent + "/llmctl-dataset-fuzz-XXXXXX";
    Check(::mkdtemp(pattern.data()) != nullptr);
    const fs::path dir(pattern);
    fs::create_directories(dir / "images");
    fs::create_directories(dir / "sub" / "deeper");
    for (const char* name : {"images/00000.png", "images/00001.png", "photo.jpg", "a,b.jpg",
                             "caf\xC3\xA9.jpg", "sub/deeper/x.png", "with space.png"}) {
      std::ofstream(dir / name, std::ios::binary) << "";
    }
    std::atexit([] {
      std::error_code ignored;
      fs::remove_all(ScratchFolder(), ignored);
    });
    return new fs::path(dir);
  }();
  return *folder;
}

StatusOr<std::vector<llmctl::image::CaptionedImage>> ReadFolder(std::string_view metadata, bool csv,
                                                                const std::string& column) {
  const fs::path& dir = ScratchFolder();
  std::error_code ignored;
  fs::remove(dir / (csv ? "metadata.jsonl" : "metadata.csv"), ignored);
  {
    std::ofstream out(dir / (csv ? "metadata.csv" : "metadata.jsonl"),
                      std::ios::binary | std::ios::trunc);
    out.write(metadata.data(), static_cast<std::streamsize>(metadata.size()));
    Check(out.good());
  }
  return llmctl::image::ReadImageFolder(dir.string(), std::string(kDisplayFolder), column);
}

void FuzzImageFolder(std::string_view metadata, bool csv, const std::string& column) {
  const fs::path& dir = ScratchFolder();
  const std::string where =
      std::string(kDisplayFolder) + (csv ? "/metadata.csv" : "/metadata.jsonl");
  const StatusOr<std::vector<llmctl::image::CaptionedImage>> images =
      ReadFolder(metadata, csv, column);
  // A line is where a record starts: at most one past the line breaks there are.
  size_t line_breaks = 0;
  for (size_t i = 0; i < metadata.size(); ++i) {
    line_breaks += metadata[i] == '\n' || (csv && metadata[i] == '\r' &&
                                           (i + 1 == metadata.size() || metadata[i + 1] != '\n'));
  }
  if (!images.ok()) {
    Check(images.status().code() == StatusCode::kInvalidArgument);
    const std::string& message = images.status().message();
    // The folder is named as the user named it (unless the metadata itself wrote its real path).
    Check(message.find(dir.string()) == std::string::npos ||
          metadata.find(dir.string()) != std::string_view::npos);
    Check(message.starts_with(where + ":") || message.starts_with(where + ": "));
    const std::string_view rest = std::string_view(message).substr(where.size() + 1);
    if (!rest.empty() && rest[0] >= '0' && rest[0] <= '9') {
      const size_t digits = rest.find_first_not_of("0123456789");
      Check(digits != std::string_view::npos && digits <= 10 && rest[digits] == ':');
      const int64_t line = std::stoll(std::string(rest.substr(0, digits)));
      Check(line >= 1 && static_cast<size_t>(line) <= line_breaks + 1);
    }
  } else {
    Check(!images->empty());
    std::set<std::string> seen;
    const fs::path root = fs::canonical(dir);
    for (const llmctl::image::CaptionedImage& image : *images) {
      Check(!image.file_name.empty() && image.file_name.find('\0') == std::string::npos);
      Check(image.path == (dir / image.file_name).string());
      std::error_code error;
      Check(fs::is_regular_file(image.path, error));
      const fs::path canonical = fs::canonical(image.path, error);
      Check(!error);
      Check(canonical.string().starts_with(root.string() + "/"));
      Check(seen.insert(canonical.string()).second);
      Check(image.caption.find_first_not_of(" \t\r\n") != std::string::npos);
      if (csv) Check(IsUtf8(image.caption) && IsUtf8(image.file_name));
    }
    if (!csv) {
      // One row per line with more than blanks, after the byte-order mark the reader drops (a
      // mark then a line break is a blank first line).
      std::string_view lines = metadata;
      if (lines.starts_with(kBom)) lines.remove_prefix(kBom.size());
      size_t rows = 0;
      for (size_t start = 0; start < lines.size();) {
        size_t end = lines.find('\n', start);
        if (end == std::string_view::npos) end = lines.size();
        rows += lines.substr(start, end - start).find_first_not_of(" \t\r") !=
                std::string_view::npos;
        start = end + 1;
      }
      Check(images->size() == rows);
    } else {
      Check(images->size() <= line_breaks);  // a header row, then one row per entry
    }
  }

  // Line ends and a byte-order mark do not change what is read (captions compared without '\r':
  // a quoted line break in a CSV caption is kept as written, and JSON's "\r" escape is one).
  const auto same_outcome = [&](const StatusOr<std::vector<llmctl::image::CaptionedImage>>& other) {
    if (images.ok() != other.ok()) return false;
    if (!images.ok()) return true;
    if (images->size() != other->size()) return false;
    for (size_t i = 0; i < images->size(); ++i) {
      if ((*images)[i].file_name != (*other)[i].file_name ||
          ReplaceAll((*images)[i].caption, "\r", "") != ReplaceAll((*other)[i].caption, "\r", "")) {
        return false;
      }
    }
    return true;
  };
  if (metadata.find('\r') == std::string_view::npos &&
      metadata.find('\n') != std::string_view::npos) {
    Check(same_outcome(ReadFolder(ReplaceAll(metadata, "\n", "\r\n"), csv, column)));
  }
  if (!metadata.starts_with(kBom)) {
    Check(same_outcome(ReadFolder(std::string(kBom) + std::string(metadata), csv, column)));
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const uint8_t choice = data[0];
  const std::string_view content(reinterpret_cast<const char*>(data) + 1, size - 1);
  const bool flag = (choice & 4) != 0;
  const int64_t max_seq_length = 2 + 4 * (choice >> 3);
  switch (choice & 3) {
    case 0:
      FuzzNames(content);
      FuzzJsonl(content, DatasetFormat::kAlpaca, flag, max_seq_length);
      break;
    case 1:
      FuzzNames(content);
      FuzzJsonl(content, DatasetFormat::kText, flag, max_seq_length);
      break;
    case 2:
      FuzzImageFolder(content, /*csv=*/false, flag ? "caption" : "text");
      break;
    default:
      FuzzImageFolder(content, /*csv=*/true, flag ? "caption" : "text");
      break;
  }
  return 0;
}
