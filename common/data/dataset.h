// Fine-tuning datasets: JSON Lines records, prompt templates, and tokenized examples.
//
// Pipeline: ForEachJsonlRecord (records, validated line by line) → RenderExample (prompt and
// response text through a template) → TokenizeExample (ids and HF-style labels). token_file.h
// stores the result for training.
#ifndef LLMCTL_COMMON_DATA_DATASET_H_
#define LLMCTL_COMMON_DATA_DATASET_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "common/data/text_encoder.h"
#include "common/status.h"

namespace llmctl::data {

// Label value that the loss ignores (PyTorch's and Hugging Face's ignore_index).
inline constexpr int32_t kIgnoreIndex = -100;

// "alpaca": objects with "instruction", "output" and an optional "input" (Stanford Alpaca, the
// labs' Alpaca2k). "text": objects with a "text" field, trained on whole.
enum class DatasetFormat { kAlpaca, kText };
StatusOr<DatasetFormat> ParseDatasetFormat(std::string_view name);
std::string_view DatasetFormatName(DatasetFormat format);

struct Record {
  std::string instruction;  // alpaca
  std::string input;        // alpaca; "" when absent or null
  std::string output;       // alpaca
  std::string text;         // text
  int64_t line = 0;         // 1-based line in the source file
};

// Parses JSON Lines. Blank lines are skipped; LF and CRLF line ends (mixed too) and a UTF-8
// byte-order mark are accepted. Lines end at LF only, as in the datasets library: a line that
// holds a CR alone and is not valid JSON (a file with classic Mac OS line ends) is refused as such.
// Errors name `file_name`:line ("data.jsonl:17: missing field 'output'"); an input without records
// is an error. Fields other than the format's are ignored. A line longer than kMaxJsonlLineBytes
// is refused naming it: a reader holds one line at a time, and a file that is not JSON Lines (or
// whose lines end in CR alone) would otherwise be held whole as its first line.
inline constexpr size_t kMaxJsonlLineBytes = size_t{64} << 20;
StatusOr<std::vector<Record>> ParseJsonl(std::string_view content, std::string_view file_name,
                                         DatasetFormat format);

// The records of the JSON Lines file at `path`, parsed as ParseJsonl parses, naming `path`, and
// handed to `on_record` in order as each line ends: the file is read kFilePieceBytes at a time,
// so a reader holds one line of it, not the file (what `on_record` keeps is its own). The first
// error, the reader's or `on_record`'s, ends the reading. `content_hash`, when given, receives
// Fnv1a64 of the bytes read, which are exactly those parsed even if the file changes meanwhile.
Status ForEachJsonlRecord(const std::string& path, DatasetFormat format,
                          const std::function<Status(Record record)>& on_record,
                          uint64_t* content_hash = nullptr);
// Every record of the file at `path` (ForEachJsonlRecord), for files small enough to hold.
StatusOr<std::vector<Record>> LoadJsonl(const std::string& path, DatasetFormat format);

// "alpaca": the Stanford Alpaca prompt (with or without "### Input:"). "none": the instruction,
// then
// "\n\n" and the input when there is one, then "\n" — a separator, so that the response does not
// run into the prompt. The text format has no prompt and takes only "none".
enum class PromptTemplate { kAlpaca, kNone };
StatusOr<PromptTemplate> ParsePromptTemplate(std::string_view name);
std::string_view PromptTemplateName(PromptTemplate prompt_template);

struct PromptAndResponse {
  std::string prompt;    // masked out of the loss when mask_prompt
  std::string response;  // trained on
};
StatusOr<PromptAndResponse> RenderExample(const Record& record, DatasetFormat format,
                                          PromptTemplate prompt_template);

struct ExampleOptions {
  int64_t max_seq_length = 512;  // examples are cut to this many tokens (≥ 2)
  bool mask_prompt = true;       // labels = kIgnoreIndex on BOS and the prompt
};

// One training sequence. input_ids = [BOS] + tokens(prompt + response) + [EOS], cut to
// max_seq_length; labels is aligned with input_ids (Hugging Face's convention: the model shifts
// internally), equal to input_ids except kIgnoreIndex on BOS and the prompt when mask_prompt.
struct TokenizedExample {
  std::vector<int32_t> input_ids;  // [T]
  std::vector<int32_t> labels;     // [T]
  bool truncated = false;          // tokens past max_seq_length were dropped (EOS included)
};

// Prompt and response are encoded as one string, then the prompt's own token count sets the mask
// boundary, as Stanford Alpaca's and LitGPT's preparation do: encoding the response alone would
// give different tokens at the seam (SentencePiece's leading "▁", merges across "\n"), which the
// model would then never see at inference. BOS/EOS are left out when the encoder has none (id < 0).
StatusOr<TokenizedExample> TokenizeExample(const TextEncoder& encoder,
                                           const PromptAndResponse& example,
                                           const ExampleOptions& options);

}  // namespace llmctl::data

#endif  // LLMCTL_COMMON_DATA_DATASET_H_
