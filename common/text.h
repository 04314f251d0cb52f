// Small text helpers every parser needs.
#ifndef LLMCTL_COMMON_TEXT_H_
#define LLMCTL_COMMON_TEXT_H_

#include <cstddef>
#include <cstdint>
#include <limits>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace llmctl {

// `text` without leading and trailing ASCII white space.
std::string_view Trim(std::string_view text);

// The last line of `text` that is not blank (Trim leaves something), trimmed; "" when none. Lines
// end at '\n' (a '\r' before it is trimmed away), and text after the last '\n' is a line too:
// another process's reason for failing, the last thing it wrote on stderr.
std::string_view LastNonBlankLine(std::string_view text);

// Appends `bytes`, read next from a stream, to `tail`, which keeps the stream's last `max_bytes`:
// another process's stderr, whose reason for failing comes at its end.
void AppendKeepingTail(std::string& tail, std::string_view bytes, size_t max_bytes);

// The most bytes of another process's line a message quotes (OnOneLine's `max_bytes`): a trainer's
// or a rank's reason for failing, a probe's, kept to one line of a terminal and of the store.
inline constexpr size_t kQuotedLineBytes = 400;

// The most bytes of one of the controller's words (an outcome, a trial's error or notice, a node's
// or a device's name, a kernel fallback's reason, a time source; in `watch` a trial's name, which a
// report shows at its kMaxTrialNameBytes) that `llmctl report` and `llmctl watch` show on a line,
// cut by OnOneLine: the words are the controller's, of any length, and a trainer's error of 60,000
// bytes made a watch line of 60,290 each second.
inline constexpr size_t kMaxShownBytes = 300;

// ASCII case-insensitive equality ("A100-80GB" == "a100-80gb"): names, units, HTTP header fields.
bool EqualsIgnoreCase(std::string_view a, std::string_view b);

// The offset of the first byte that breaks UTF-8 (overlong forms, surrogates and code points past
// U+10FFFF included), or std::string_view::npos when `text` is valid.
size_t FirstInvalidUtf8(std::string_view text);

// Why `text`, another process's, may not be printed to a terminal as it is: "" when it is valid
// UTF-8 of at most `max_bytes` bytes without the characters OnOneLine replaces, else what is wrong
// ("longer than 64 bytes", "holds a control character", "holds a bidirectional text control",
// "not valid UTF-8"). For text checked where it arrives (a node's device name, a probe's fields).
std::string PrintableTextProblem(std::string_view text, size_t max_bytes);

// `text`, another party's (a trial's error, a cloud's name, a file's bytes), for one line of a
// terminal: each control character (C0 such as a newline or the escape that starts a sequence
// moving the cursor, DEL, C1 such as U+009B CSI, the line separators U+2028 and U+2029) and each
// bidirectional text control (U+061C, U+200E, U+200F, U+202A to U+202E, U+2066 to U+2069, which
// reorder what a terminal or an editor shows around them) replaced by a space, and each byte that
// breaks UTF-8 by U+FFFD. Longer than `max_bytes`, it is cut at a character's start and ends in
// "…" (both within `max_bytes`): a field of a table or a line of watch stays a line.
std::string OnOneLine(std::string_view text, size_t max_bytes = std::numeric_limits<size_t>::max());

// OnOneLine, keeping newlines and tabs: a message of several lines that may hold another party's
// words (an error the controller sent). Every line after the first starts with white space (two
// spaces are added where it does not), so that no line of the message reads as a line of the
// program's own, such as "llmctl: ..." or a table's row.
std::string ForTerminal(std::string_view text,
                        size_t max_bytes = std::numeric_limits<size_t>::max());

// `text` with each byte that breaks UTF-8 (FirstInvalidUtf8's) replaced by U+FFFD: another
// process's text, such as a trainer's stderr cut anywhere, made fit for a proto3 string or JSON.
std::string ReplaceInvalidUtf8(std::string_view text);

// The items with `separator` between each two ("a, b, c"): lists of names in messages.
std::string Join(const std::vector<std::string_view>& items, std::string_view separator);

// "1 trial", "3 trials": a count and its noun, `one` for exactly one and `many` otherwise.
std::string CountOf(int64_t count, std::string_view one, std::string_view many);

// `text` with every occurrence of each key of `names` replaced by its value, longest key first (so
// a path wins over its own prefix). Used to name inputs in messages by the path the user wrote
// rather than where a copy of it lives.
std::string NameInputs(std::string text, const std::map<std::string, std::string>& names);

// llm-train's --input-name argument PATH=NAME: messages name the input at `path` (its copy on the
// node) `name` (the path the experiment wrote). A file's own name may hold '=', and so may the
// path the user wrote, so each '\' and '=' of PATH is written "\\" and "\=": the first '=' not
// so written ends PATH, whatever either holds.
std::string InputNameArgument(std::string_view path, std::string_view name);
// (PATH, NAME) from an InputNameArgument; nullopt when no '=' ends PATH, PATH or NAME is empty, or
// a '\' of PATH is followed by neither '\' nor '='.
std::optional<std::pair<std::string, std::string>> ParseInputNameArgument(
    std::string_view argument);

// The rows as text columns two spaces apart, one line each, every column as wide as its widest cell
// counted in characters (UTF-8 such as "–" counts once). Columns from `first_right_aligned` on are
// right-aligned (numbers); rows may have fewer cells than others; no line ends in a space. The one
// table printer of the command-line tools.
std::string FormatColumns(const std::vector<std::vector<std::string>>& rows,
                          size_t first_right_aligned = std::numeric_limits<size_t>::max());

// `word` as one word of a POSIX shell's command line, which the shell reads back as `word`: as it
// is when it is not empty and holds only letters, digits and "_-./:=@%+,", else between single
// quotes with each quote of its own written '\''. For the command lines tests run through /bin/sh
// and those llmctl prints for a person to run (whose words pass through OnOneLine first), where a
// word spliced in as it was broke the line at its first quote or space.
std::string ShellWord(std::string_view word);

// `text` for a URI's path or query: RFC 3986 unreserved bytes stay, everything else is %XX ('/'
// too unless `keep_slash`).
std::string PercentEncode(std::string_view text, bool keep_slash);

}  // namespace llmctl

#endif  // LLMCTL_COMMON_TEXT_H_
