// One YAML document read as untrusted text, as experiment files are: a syntax error (a tab in
// indentation named as such), nesting deeper than yaml-cpp reads (500 levels), more than
// kMaxYamlValues values, a second document, text that is not UTF-8, and the YAML features an
// experiment file may not use (anchors, aliases, tags) are refused at their place in the file.
#ifndef LLMCTL_COMMON_YAML_DOCUMENT_H_
#define LLMCTL_COMMON_YAML_DOCUMENT_H_

#include <yaml-cpp/yaml.h>

#include <cstddef>
#include <string>
#include <string_view>

#include "common/status.h"

namespace llmctl {

// The most scalars, lists and maps a document may hold: a shipped experiment file holds about 300,
// and yaml-cpp's nodes take about 500 bytes each (this many, 50 MB).
inline constexpr size_t kMaxYamlValues = 100'000;

// InvalidArgument "FILE:LINE:COLUMN: message" with 1-based positions (yaml-cpp's marks are
// 0-based; a null mark is 1:1), each byte of `message` that breaks UTF-8 written as \xNN
// (yaml-cpp quotes input bytes in some messages).
Status YamlErrorAt(std::string_view filename, const YAML::Mark& mark, const std::string& message);

// `text`'s one document; InvalidArgument (YamlErrorAt) for what the file comment lists.
StatusOr<YAML::Node> LoadYamlDocument(std::string_view text, std::string_view filename);

// The most bytes of a settings file (the controller's config, llmctl's config.yaml, clouds.yaml):
// a few dozen lines, and a wrong path to a large file fails fast.
inline constexpr size_t kMaxYamlSettingsBytes = 1 << 20;

// `text`'s first document, a settings file's: a syntax error, nesting deeper than yaml-cpp reads
// and more than kMaxYamlValues values are refused as LoadYamlDocument refuses them; the rest of
// what it refuses (anchors, tags, a second document, text that is not UTF-8) is an experiment's
// rule, and yaml-cpp reads it as it always did.
StatusOr<YAML::Node> LoadYamlSettings(std::string_view text, std::string_view filename);

// True for text with nothing but blank lines, comments and document markers.
bool HasNoYamlContent(std::string_view text);

}  // namespace llmctl

#endif  // LLMCTL_COMMON_YAML_DOCUMENT_H_
