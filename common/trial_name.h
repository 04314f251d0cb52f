// A trial's name as every process takes it: the experiment file makes it (its `name`, with a
// sweep's "/key=value,..." after it), the controller stores it, and the agent names the run's
// directory after it, escaped (EncodeTrialName). The file's parser refuses a name a node would,
// with the file's line, rather than a node refusing the trial at launch.
#ifndef LLMCTL_COMMON_TRIAL_NAME_H_
#define LLMCTL_COMMON_TRIAL_NAME_H_

#include <cstddef>
#include <optional>
#include <string>
#include <string_view>

namespace llmctl {

inline constexpr size_t kMaxTrialNameBytes = 200;
// A directory's name (NAME_MAX), which the escaped name must fit.
inline constexpr size_t kMaxEncodedTrialNameBytes = 255;

// Trial names as directory names: bytes other than [A-Za-z0-9._-] become %XX, so
// "base/precision=bf16-true" is "base%2Fprecision%3Dbf16-true".
std::string EncodeTrialName(std::string_view trial);
// EncodeTrialName's inverse; none for a name that is not one of its results.
std::optional<std::string> DecodeTrialName(std::string_view encoded);

// Why no node can run a trial named `name`: "" when it can, else "must be 1 to 200 bytes and not
// '.' or '..'" or "is N bytes as a directory name ('/', '=', ',' and other bytes than letters,
// digits, '.', '_' and '-' take 3), over 255", or PrintableTextProblem's reason ("holds a control
// character", ...): a name is printed wherever trials are listed.
std::string TrialNameProblem(std::string_view name);

}  // namespace llmctl

#endif  // LLMCTL_COMMON_TRIAL_NAME_H_
