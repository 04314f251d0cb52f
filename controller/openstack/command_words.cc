#include "controller/openstack/command_words.h"

#include "common/text.h"

namespace llmctl::openstack {

std::optional<int> ParseCommandWords(CLI::App& app, const std::vector<std::string>& words,
                                     std::string_view group, std::ostream& out, std::ostream& err) {
  // CLI11 takes the words last first.
  std::vector<std::string> reversed(words.rbegin(), words.rend());
  try {
    app.parse(reversed);
  } catch (const CLI::CallForHelp&) {
    out << app.help();
    return 0;
  } catch (const CLI::ParseError& error) {
    err << "llmctl " << group << ": " << error.what() << "\n";
    return 2;
  }
  return std::nullopt;
}

int CommandExitCode(const Status& status, std::string_view group, std::string_view command,
                    std::ostream& err) {
  if (status.ok()) return 0;
  // The message quotes the cloud (a lease's or server's name, Nova's fault, an API's error text)
  // or the controller: OnOneLine keeps their escape sequences off the terminal and, since each
  // error is one line of `err`, keeps a newline of theirs from forging a line of llmctl's.
  err << "llmctl " << group << " " << command << ": " << OnOneLine(status.message()) << "\n";
  switch (status.code()) {
    case StatusCode::kInvalidArgument:
      return 2;
    case StatusCode::kUnavailable:
    case StatusCode::kDeadlineExceeded:
      return 3;
    default:
      return 1;
  }
}

}  // namespace llmctl::openstack
