// IsHubModelRef, MakeHubModelRef, ParseHubModelRef and HubModelRefText (model_config.h): a model
// on the Hugging Face hub as an experiment names it, checked for form.
#include <algorithm>
#include <cctype>
#include <string>
#include <string_view>

#include "common/model_config.h"

namespace llmctl {

namespace {

bool IsRepoIdChar(char c) {
  return std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '_' || c == '-';
}

// The hub's rule for one half of a repository id.
bool IsRepoIdPart(std::string_view part) {
  return !part.empty() && part.size() <= 96 &&
         std::all_of(part.begin(), part.end(), IsRepoIdChar) &&
         part.find("--") == std::string_view::npos && part.find("..") == std::string_view::npos &&
         part.front() != '.' && part.front() != '-' && part.back() != '.' && part.back() != '-';
}

}  // namespace

bool IsHubModelRef(std::string_view model) { return model.starts_with(kHubModelPrefix); }

StatusOr<HubModelRef> MakeHubModelRef(std::string_view repo, std::string_view revision) {
  const size_t slash = repo.find('/');
  if (slash == std::string_view::npos || !IsRepoIdPart(repo.substr(0, slash)) ||
      !IsRepoIdPart(repo.substr(slash + 1))) {
    return InvalidArgumentError(
        "'" + std::string(repo) +
        "' is not a Hugging Face repository id: expected ORG/NAME, each part 1-96 letters, digits, "
        "'.', '_' or '-' (e.g. TinyLlama/TinyLlama-1.1B-intermediate-step-1431k-3T)");
  }
  if (revision.empty()) revision = "main";
  const bool revision_ok = revision.size() <= 255 &&
                           std::all_of(revision.begin(), revision.end(),
                                       [](char c) { return IsRepoIdChar(c) || c == '/'; }) &&
                           revision.find("..") == std::string_view::npos &&
                           revision.front() != '/' && revision.back() != '/' &&
                           revision.find("//") == std::string_view::npos;
  if (!revision_ok) {
    return InvalidArgumentError("'" + std::string(revision) +
                                "' is not a revision: expected a branch, tag or commit of letters, "
                                "digits, '.', '_', '-' and '/'");
  }
  return HubModelRef{std::string(repo), std::string(revision)};
}

StatusOr<HubModelRef> ParseHubModelRef(std::string_view model) {
  if (!IsHubModelRef(model)) {
    return InvalidArgumentError("'" + std::string(model) + "' does not start with hf:");
  }
  std::string_view rest = model.substr(kHubModelPrefix.size());
  std::string_view revision;
  if (const size_t at = rest.find('@'); at != std::string_view::npos) {
    revision = rest.substr(at + 1);
    rest = rest.substr(0, at);
    if (revision.empty()) {
      return InvalidArgumentError("model " + std::string(model) +
                                  ": nothing after '@'; write hf:ORG/NAME or hf:ORG/NAME@REVISION");
    }
  }
  auto ref = MakeHubModelRef(rest, revision);
  if (!ref.ok()) return ref.status().WithContext("model " + std::string(model));
  return ref;
}

std::string HubModelRefText(const HubModelRef& ref) {
  return std::string(kHubModelPrefix) + ref.repo + "@" + ref.revision;
}

}  // namespace llmctl
