#include "common/tokenizer/tokenizer.h"

#include <algorithm>
#include <deque>
#include <exception>
#include <filesystem>
#include <limits>
#include <sstream>
#include <utility>

#include "common/files.h"
#include "common/tokenizer/added_vocabulary.h"
#include "common/tokenizer/bpe.h"
#include "common/tokenizer/decoder.h"
#include "common/tokenizer/json_util.h"
#include "common/tokenizer/normalizer.h"
#include "common/tokenizer/post_processor.h"
#include "common/tokenizer/pre_tokenizer.h"
#include "common/tokenizer/tokenizer_json.h"
#include "common/tokenizer/unicode.h"
#include "common/tokenizer/unigram.h"

namespace llmctl {
namespace tokenizer_internal {

// Everything a Tokenizer holds. Constant after loading.
struct TokenizerState {
  std::string source;
  std::unique_ptr<Normalizer> normalizer;         // may be null
  std::unique_ptr<PreTokenizer> pre_tokenizer;    // may be null
  std::unique_ptr<Model> model;                   // never null: BPE or Unigram
  std::unique_ptr<AddedVocabulary> added;         // never null
  std::unique_ptr<PostProcessor> post_processor;  // may be null
  std::unique_ptr<Decoder> decoder;               // may be null: tokens are joined with spaces
  std::optional<int32_t> bos;
  std::optional<int32_t> eos;
  std::optional<int32_t> pad;
  bool adds_bos = false;
  bool adds_eos = false;
  int32_t vocab_size = 0;

  std::optional<int32_t> TokenToId(std::string_view token) const {
    if (auto id = added->TokenToId(token)) return id;
    return model->TokenToId(token);
  }
  // The added vocabulary's token for `id`, else the model's.
  std::optional<std::string_view> IdToToken(int32_t id) const {
    if (const std::string* token = added->IdToToken(id)) return *token;
    return model->IdToToken(id);
  }
  std::optional<int32_t> FirstKnown(std::initializer_list<std::string_view> names) const {
    for (std::string_view name : names) {
      if (auto id = TokenToId(name)) return id;
    }
    return std::nullopt;
  }
};

namespace {

// model.vocab or model.merges as the parse read it: present, of the shape the model reads
// (`expected`), and with no entry refused (`entry_error`).
Status CheckStreamed(const JsonSource& src, std::string_view path, MemberShape shape,
                     MemberShape expected, const Status& entry_error,
                     std::string_view wrong_shape) {
  if (shape == MemberShape::kAbsent) return src.Invalid(path, "missing required field");
  if (shape != expected) return src.Invalid(path, wrong_shape);
  return entry_error;
}

// The model's vocab and merges (a BPE model's: an object and an array) are in `file`, read as the
// parse went past them; `json` is the rest of the model object.
StatusOr<std::unique_ptr<BpeModel>> ParseBpeModel(const JsonSource& src, const Json& json,
                                                  const std::string& path, TokenizerJson* file) {
  if (const Json* dropout = FindMember(json, "dropout")) {
    if (!dropout->is_number()) return src.Invalid(JoinPath(path, "dropout"), "expected a number");
    const double p = dropout->get<double>();
    if (!(p >= 0.0 && p <= 1.0)) {
      return src.Invalid(JoinPath(path, "dropout"), "must be between 0 and 1");
    }
    if (p > 0.0) {
      return src.Unsupported(JoinPath(path, "dropout"),
                             "BPE dropout is not supported (it makes encoding random)");
    }
  }
  for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"}) {
    if (const Json* affix = FindMember(json, key)) {
      if (!affix->is_string()) return src.Invalid(JoinPath(path, key), "expected a string or null");
      if (!affix->get_ref<const std::string&>().empty()) {
        return src.Unsupported(
            JoinPath(path, key),
            std::string(key) + " is not supported (LLaMA-family files have none)");
      }
    }
  }
  BpeOptions options;
  if (const Json* unk = FindMember(json, "unk_token")) {
    if (!unk->is_string())
      return src.Invalid(JoinPath(path, "unk_token"), "expected a string or null");
    options.unk_token = unk->get<std::string>();
  }
  ASSIGN_OR_RETURN(options.fuse_unk, OptionalBool(src, json, path, "fuse_unk", false));
  ASSIGN_OR_RETURN(options.byte_fallback, OptionalBool(src, json, path, "byte_fallback", false));
  ASSIGN_OR_RETURN(options.ignore_merges, OptionalBool(src, json, path, "ignore_merges", false));

  RETURN_IF_ERROR(CheckStreamed(src, JoinPath(path, "vocab"), file->vocab.shape,
                                MemberShape::kObject, file->vocab.error,
                                "expected an object mapping tokens to ids"));
  RETURN_IF_ERROR(CheckStreamed(src, JoinPath(path, "merges"), file->merges.shape,
                                MemberShape::kArray, file->merges.error, "expected an array"));
  StatusOr<std::unique_ptr<BpeModel>> model =
      BpeModel::Create(std::move(file->vocab.token_ids), file->merges.merges, std::move(options));
  file->merges = StreamedMerges();  // their text is in the model's tables now
  if (!model.ok()) return src.Invalid(path, model.status().message());
  return std::move(*model);
}

// A Unigram model's vocab (an array of [piece, score]) is in `file`; `json` is the rest of the
// model object.
StatusOr<std::unique_ptr<UnigramModel>> ParseUnigramModel(const JsonSource& src, const Json& json,
                                                          const std::string& path,
                                                          TokenizerJson* file) {
  std::optional<int32_t> unk_id;
  if (const Json* unk = FindMember(json, "unk_id")) {
    ASSIGN_OR_RETURN(unk_id, AsTokenId(src, *unk, JoinPath(path, "unk_id")));
  }
  ASSIGN_OR_RETURN(const bool byte_fallback, OptionalBool(src, json, path, "byte_fallback", false));
  RETURN_IF_ERROR(CheckStreamed(src, JoinPath(path, "vocab"), file->vocab.shape,
                                MemberShape::kArray, file->vocab.error,
                                "expected an array of [piece, score]"));
  std::deque<UnigramPiece>& vocab = file->vocab.pieces;
  if (unk_id.has_value() && static_cast<size_t>(*unk_id) >= vocab.size()) {
    return src.Invalid(JoinPath(path, "unk_id"), "unk_id " + std::to_string(*unk_id) +
                                                     " is not in the vocabulary of " +
                                                     std::to_string(vocab.size()) + " pieces");
  }
  StatusOr<std::unique_ptr<UnigramModel>> model =
      UnigramModel::Create(std::move(vocab), unk_id, byte_fallback);
  if (!model.ok()) return src.Invalid(path, model.status().message());
  return std::move(*model);
}

StatusOr<std::unique_ptr<Model>> ParseModel(const JsonSource& src, TokenizerJson* file) {
  ASSIGN_OR_RETURN(const Json* model, RequireMember(src, file->kept, "", "model"));
  if (!model->is_object()) return src.Invalid("model", "expected an object");
  std::string type;
  if (const Json* type_json = FindMember(*model, "type")) {
    if (!type_json->is_string()) return src.Invalid("model.type", "expected a string");
    type = type_json->get<std::string>();
  } else if (file->merges.shape != MemberShape::kAbsent) {
    type = "BPE";  // files from before models were tagged
  } else {
    return src.Invalid("model.type", "missing required field");
  }
  if (type == "BPE") {
    ASSIGN_OR_RETURN(std::unique_ptr<BpeModel> bpe, ParseBpeModel(src, *model, "model", file));
    return std::unique_ptr<Model>(std::move(bpe));
  }
  if (type == "Unigram") {
    ASSIGN_OR_RETURN(std::unique_ptr<UnigramModel> unigram,
                     ParseUnigramModel(src, *model, "model", file));
    return std::unique_ptr<Model>(std::move(unigram));
  }
  if (type == "WordPiece" || type == "WordLevel") {
    return src.Unsupported("model.type",
                           "model type \"" + type +
                               "\" is not supported (only BPE, as used by LLaMA, Mistral, Qwen2, "
                               "and Unigram, as used by T5)");
  }
  return src.Invalid("model.type", "unknown model type \"" + type + "\"");
}

StatusOr<std::vector<AddedToken>> ParseAddedTokens(const JsonSource& src, const Json& root) {
  std::vector<AddedToken> tokens;
  const Json* list = FindMember(root, "added_tokens");
  if (list == nullptr) return tokens;
  if (!list->is_array()) return src.Invalid("added_tokens", "expected an array");
  for (size_t i = 0; i < list->size(); ++i) {
    const Json& entry = (*list)[i];
    const std::string path = IndexPath("added_tokens", i);
    if (!entry.is_object()) return src.Invalid(path, "expected an object");
    // The id is required but, as in the library, not trusted: ids follow from the model's
    // vocabulary.
    ASSIGN_OR_RETURN(const Json* id, RequireMember(src, entry, path, "id"));
    RETURN_IF_ERROR(AsTokenId(src, *id, JoinPath(path, "id")).status());
    AddedToken token;
    ASSIGN_OR_RETURN(token.content, RequireString(src, entry, path, "content"));
    ASSIGN_OR_RETURN(token.special, OptionalBool(src, entry, path, "special", false));
    ASSIGN_OR_RETURN(token.single_word, OptionalBool(src, entry, path, "single_word", false));
    ASSIGN_OR_RETURN(token.lstrip, OptionalBool(src, entry, path, "lstrip", false));
    ASSIGN_OR_RETURN(token.rstrip, OptionalBool(src, entry, path, "rstrip", false));
    ASSIGN_OR_RETURN(token.normalized,
                     OptionalBool(src, entry, path, "normalized", !token.special));
    tokens.push_back(std::move(token));
  }
  return tokens;
}

// BOS/EOS from what the post-processor puts around a sequence.
void InferSpecialTokens(TokenizerState* state) {
  if (state->post_processor != nullptr) {
    constexpr int32_t kSequence = -1;  // never a real id
    std::vector<int32_t> ids = {kSequence};
    state->post_processor->AddSpecialTokens(&ids);
    const auto first = std::find(ids.begin(), ids.end(), kSequence);
    if (first != ids.end()) {
      const auto last = std::find(ids.rbegin(), ids.rend(), kSequence).base();
      if (first != ids.begin()) {
        state->adds_bos = true;
        state->bos = ids.front();
      }
      if (last != ids.end()) {
        state->adds_eos = true;
        state->eos = ids.back();
      }
    }
  }
  if (!state->bos) {
    state->bos = state->FirstKnown({"<s>", "<|begin_of_text|>", "<|startoftext|>", "<bos>"});
  }
  if (!state->eos) {
    state->eos = state->FirstKnown({"</s>", "<|end_of_text|>", "<|endoftext|>", "<eos>"});
  }
  if (!state->pad) state->pad = state->FirstKnown({"<pad>", "<|pad|>", "[PAD]", "<|padding|>"});
}

// The "padding" block of tokenizer.json, when set, names the pad token.
Status ReadPadding(const JsonSource& src, const Json& root, TokenizerState* state) {
  const Json* padding = FindMember(root, "padding");
  if (padding == nullptr) return Status::Ok();
  if (!padding->is_object()) return src.Invalid("padding", "expected an object or null");
  if (const Json* token = FindMember(*padding, "pad_token");
      token != nullptr && token->is_string()) {
    state->pad = state->TokenToId(token->get_ref<const std::string&>());
  }
  if (!state->pad) {
    if (const Json* id = FindMember(*padding, "pad_id")) {
      ASSIGN_OR_RETURN(state->pad, AsTokenId(src, *id, "padding.pad_id"));
    }
  }
  return Status::Ok();
}

// The tokenizer `file` describes, read from `src`.
StatusOr<std::unique_ptr<TokenizerState>> BuildTokenizer(const JsonSource& src,
                                                         TokenizerJson file) {
  const Json& root = file.kept;
  if (const Json* version = FindMember(root, "version")) {
    if (!version->is_string() || version->get_ref<const std::string&>() != "1.0") {
      return src.Invalid("version", "unknown tokenizer.json version (expected \"1.0\")");
    }
  }
  auto state = std::make_unique<TokenizerState>();
  state->source = src.name();
  if (const Json* json = FindMember(root, "normalizer")) {
    ASSIGN_OR_RETURN(state->normalizer, ParseNormalizer(src, *json, "normalizer"));
  }
  if (const Json* json = FindMember(root, "pre_tokenizer")) {
    ASSIGN_OR_RETURN(state->pre_tokenizer, ParsePreTokenizer(src, *json, "pre_tokenizer"));
  }
  ASSIGN_OR_RETURN(state->model, ParseModel(src, &file));
  if (const Json* json = FindMember(root, "post_processor")) {
    ASSIGN_OR_RETURN(state->post_processor, ParsePostProcessor(src, *json, "post_processor"));
  }
  if (const Json* json = FindMember(root, "decoder")) {
    ASSIGN_OR_RETURN(state->decoder, ParseDecoder(src, *json, "decoder"));
  }
  ASSIGN_OR_RETURN(const std::vector<AddedToken> added_tokens, ParseAddedTokens(src, root));
  StatusOr<std::unique_ptr<AddedVocabulary>> added =
      AddedVocabulary::Create(added_tokens, *state->model, state->normalizer.get());
  if (!added.ok()) return src.Invalid("added_tokens", added.status().message());
  state->added = std::move(*added);
  // The vocabulary's size, one past its largest id, must fit the int32 ids themselves. Added
  // tokens take ids after the model's, so only the model's can be the largest possible.
  if (state->model->max_id() == std::numeric_limits<int32_t>::max()) {
    return src.Invalid("model", "token id " + std::to_string(state->model->max_id()) +
                                    " is too large: ids go up to 2147483646");
  }
  state->vocab_size = std::max(state->model->max_id(), state->added->max_id()) + 1;
  RETURN_IF_ERROR(ReadPadding(src, root, state.get()));
  InferSpecialTokens(state.get());
  return state;
}

// A regular file only (common/files.h): a device or FIFO given as a tokenizer is refused at once.
// The largest published tokenizer.json files are ~35 MB (Gemma 3's: 33 MB); the limit makes a wrong
// file fail fast.
StatusOr<std::string> ReadFile(const std::filesystem::path& path) {
  return ReadFileToString(path.string(), 256 << 20);
}

// The file at `path` read through. Its text is freed on return, before a model's tables are built
// from what was read: 13.3 MiB for a Llama 3-shaped tokenizer.json, 2.3 MiB for T5's.
StatusOr<TokenizerJson> ReadTokenizerFile(const JsonSource& src,
                                          const std::filesystem::path& path) {
  ASSIGN_OR_RETURN(const std::string text, ReadFile(path));
  return ReadTokenizerJson(src, text);
}

// tokenizer_config.json's bos_token/eos_token/pad_token: a string, an AddedToken object or null.
Status ApplyTokenizerConfig(const std::filesystem::path& path, TokenizerState* state) {
  const JsonSource src{path.string()};
  // Read as tokenizer.json is (it has no model): at most kMaxKeptJsonValues values.
  ASSIGN_OR_RETURN(const TokenizerJson file, ReadTokenizerFile(src, path));
  const Json& root = file.kept;
  const std::pair<const char*, std::optional<int32_t>*> fields[] = {
      {"bos_token", &state->bos}, {"eos_token", &state->eos}, {"pad_token", &state->pad}};
  for (const auto& [key, target] : fields) {
    const auto it = root.find(key);
    if (it == root.end()) continue;
    if (it->is_null()) {
      *target = std::nullopt;
      continue;
    }
    const Json* content = it->is_object() ? FindMember(*it, "content") : &*it;
    if (content == nullptr || !content->is_string()) {
      return src.Invalid(key, "expected a token string, an object with \"content\", or null");
    }
    const auto& token = content->get_ref<const std::string&>();
    std::optional<int32_t> id = state->TokenToId(token);
    if (!id)
      return src.Invalid(key, "token \"" + token + "\" is not in the tokenizer's vocabulary");
    *target = id;
  }
  return Status::Ok();
}

}  // namespace
}  // namespace tokenizer_internal

using tokenizer_internal::Piece;
using tokenizer_internal::TokenizerState;

Tokenizer::Tokenizer(std::unique_ptr<TokenizerState> state) : state_(std::move(state)) {}
Tokenizer::Tokenizer(Tokenizer&&) noexcept = default;
Tokenizer& Tokenizer::operator=(Tokenizer&&) noexcept = default;
Tokenizer::~Tokenizer() = default;

StatusOr<Tokenizer> Tokenizer::FromJson(std::string_view json, std::string_view source_name) {
  try {
    const tokenizer_internal::JsonSource src{std::string(source_name)};
    ASSIGN_OR_RETURN(tokenizer_internal::TokenizerJson file,
                     tokenizer_internal::ReadTokenizerJson(src, json));
    ASSIGN_OR_RETURN(auto state, tokenizer_internal::BuildTokenizer(src, std::move(file)));
    return Tokenizer(std::move(state));
  } catch (const std::exception& e) {
    // Nothing above should throw; this keeps a surprise (e.g. std::bad_alloc on a huge file) inside
    // the API.
    return InternalError(std::string(source_name) + ": " + e.what());
  }
}

StatusOr<Tokenizer> Tokenizer::Load(const std::string& path) {
  try {
    namespace fs = std::filesystem;
    std::error_code ec;
    fs::path file = path;
    if (fs::is_directory(file, ec)) file /= "tokenizer.json";
    if (!fs::exists(file, ec)) {
      if (fs::exists(file.parent_path() / "tokenizer.model", ec)) {
        return UnimplementedError(
            file.string() +
            ": no such file, and SentencePiece tokenizer.model files are not "
            "supported (transformers' LlamaTokenizerFast writes a "
            "tokenizer.json: AutoTokenizer.from_pretrained(dir).save_pretrained(dir))");
      }
      return NotFoundError(file.string() + ": no such file");
    }
    const tokenizer_internal::JsonSource src{file.string()};
    ASSIGN_OR_RETURN(tokenizer_internal::TokenizerJson json,
                     tokenizer_internal::ReadTokenizerFile(src, file));
    ASSIGN_OR_RETURN(auto state, tokenizer_internal::BuildTokenizer(src, std::move(json)));
    const fs::path config = file.parent_path() / "tokenizer_config.json";
    if (fs::exists(config, ec)) {
      RETURN_IF_ERROR(tokenizer_internal::ApplyTokenizerConfig(config, state.get()));
    }
    return Tokenizer(std::move(state));
  } catch (const std::exception& e) {
    return InternalError(path + ": " + e.what());
  }
}

StatusOr<std::vector<int32_t>> Tokenizer::Encode(std::string_view text,
                                                 bool add_special_tokens) const {
  if (std::optional<size_t> bad = tokenizer_internal::FindInvalidUtf8(text)) {
    return InvalidArgumentError("text to encode is not valid UTF-8 (byte " + std::to_string(*bad) +
                                ")");
  }
  try {
    std::vector<Piece> pieces;
    RETURN_IF_ERROR(state_->added->ExtractAndNormalize(text, state_->normalizer.get(), &pieces));
    if (state_->pre_tokenizer != nullptr) {
      RETURN_IF_ERROR(state_->pre_tokenizer->PreTokenize(&pieces));
    }
    std::vector<int32_t> ids;
    ids.reserve(text.size() / 3 + 4);
    for (const Piece& piece : pieces) {
      if (piece.added_id >= 0) {
        ids.push_back(piece.added_id);
      } else {
        Status status = state_->model->Tokenize(piece.text, &ids);
        if (!status.ok()) return status.WithContext(state_->source);
      }
    }
    if (add_special_tokens && state_->post_processor != nullptr) {
      state_->post_processor->AddSpecialTokens(&ids);
    }
    return ids;
  } catch (const std::exception& e) {
    return ResourceExhaustedError(state_->source + ": encoding failed: " + e.what());
  }
}

std::string Tokenizer::Decode(std::span<const int32_t> ids, bool skip_special_tokens) const {
  std::vector<std::string> tokens;
  tokens.reserve(ids.size());
  for (int32_t id : ids) {
    const std::optional<std::string_view> token = state_->IdToToken(id);
    if (!token.has_value()) continue;
    if (skip_special_tokens && state_->added->IsSpecial(*token)) continue;
    tokens.emplace_back(*token);
  }
  std::string text;
  if (state_->decoder != nullptr) {
    state_->decoder->DecodeChain(&tokens);
    for (const std::string& token : tokens) text += token;
  } else {
    for (size_t i = 0; i < tokens.size(); ++i) {
      if (i > 0) text += ' ';
      text += tokens[i];
    }
  }
  return text;
}

std::optional<int32_t> Tokenizer::TokenToId(std::string_view token) const {
  return state_->TokenToId(token);
}

std::optional<std::string> Tokenizer::IdToToken(int32_t id) const {
  const std::optional<std::string_view> token = state_->IdToToken(id);
  if (!token.has_value()) return std::nullopt;
  return std::string(*token);
}

int32_t Tokenizer::vocab_size() const { return state_->vocab_size; }
std::optional<int32_t> Tokenizer::bos_id() const { return state_->bos; }
std::optional<int32_t> Tokenizer::eos_id() const { return state_->eos; }
std::optional<int32_t> Tokenizer::pad_id() const { return state_->pad; }
bool Tokenizer::adds_bos() const { return state_->adds_bos; }
bool Tokenizer::adds_eos() const { return state_->adds_eos; }
const std::string& Tokenizer::source() const { return state_->source; }

}  // namespace llmctl
