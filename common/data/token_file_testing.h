// Test support: a token file written from a list of examples in one call. The product streams its
// examples through a TokenFileWriter as it tokenizes them, never holding them all.
#ifndef LLMCTL_COMMON_DATA_TOKEN_FILE_TESTING_H_
#define LLMCTL_COMMON_DATA_TOKEN_FILE_TESTING_H_

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "common/data/token_file.h"
#include "common/status.h"

namespace llmctl::data {

// Writes `examples` with a TokenFileWriter (each non-empty, labels equal to the id or
// kIgnoreIndex). An empty list is an error.
inline Status WriteTokenFile(const std::string& path, std::string_view fingerprint, int32_t bos_id,
                             int32_t eos_id, const std::vector<TokenizedExample>& examples) {
  ASSIGN_OR_RETURN(TokenFileWriter writer, TokenFileWriter::Create(path));
  for (const TokenizedExample& example : examples) RETURN_IF_ERROR(writer.Add(example));
  return writer.Finish(fingerprint, bos_id, eos_id);
}

}  // namespace llmctl::data

#endif  // LLMCTL_COMMON_DATA_TOKEN_FILE_TESTING_H_
