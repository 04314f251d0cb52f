// The files of a run that FetchArtifacts may send (agent/server.cc), and reading them without
// following a link out of the run's directory. Internal to agent/.
#ifndef LLMCTL_AGENT_ARTIFACT_FILES_H_
#define LLMCTL_AGENT_ARTIFACT_FILES_H_

#include <cstdint>
#include <string>
#include <vector>

#include "agent/process.h"
#include "agent/runs.h"
#include "common/status.h"

namespace llmctl::agent {

// The regular files under `dir` (symbolic links are not followed), relative to `relative_to`,
// sorted.
std::vector<std::string> FilesBelow(const std::string& dir, const std::string& relative_to);
std::vector<std::string> FilesBelow(const std::string& dir);

// `path` (absolute, or relative to the run's directory) as a directory inside the run's output
// directory: only what the worker wrote may be fetched this way, never the agent's other files.
StatusOr<std::string> OutputSubdirectory(const std::string& run_dir, const std::string& path);

// Up to `wanted` bytes of `fd` into `buffer`: fewer only at the end of the file or on an error.
int64_t ReadFull(int fd, char* buffer, int64_t wanted);

// `root`/`path` opened for reading when it is a regular file that lies inside `root`: the file is
// opened without following a final link, and the path the kernel gives the open descriptor is
// checked, so no link, ".." or directory swapped in since the listing takes the read elsewhere.
// Invalid when it is not such a file (or was removed meanwhile); `size` is its size then.
UniqueFd OpenArtifact(const std::string& root, const std::string& path, int64_t& size);

// The run's artifacts: every regular file under output/ but those of a checkpoint's staging
// directory (output/checkpoints/step-<N>.tmp: incomplete), then the logs, as paths relative to the
// run directory.
std::vector<std::string> ArtifactPaths(const std::string& run_dir, const RunRanks& ranks);

}  // namespace llmctl::agent

#endif  // LLMCTL_AGENT_ARTIFACT_FILES_H_
