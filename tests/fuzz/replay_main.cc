// A main() for fuzz targets built without libFuzzer. It runs LLVMFuzzerTestOneInput once on every
// file named on the command line, or on every regular file inside a directory named there (not
// recursive), in sorted order: the checked-in corpus, so inputs that once crashed a parser keep
// being exercised. Then it runs a fixed number of seeded mutations of those inputs (bytes
// flipped, set, inserted, deleted or repeated, two inputs spliced, dictionary tokens and edge-case
// numbers inserted), so every test run also tries inputs nobody checked in, the same ones each
// time for the same seed.
//
//   NAME_fuzz_replay [--mutations N] [--seed S] [--dict FILE] [--only I] [--crash-dir DIR]
//                    [--timeout-s T] [--verbose] DIR_OR_FILE...
//
// --mutations N   how many mutated inputs to run after the corpus (default 0)
// --seed S        the PRNG seed (default 1); mutation I depends only on S, I and the corpus, so
// --only I        runs the corpus and mutation I alone: a failure's reproduction
// --dict FILE     a libFuzzer dictionary (tests/fuzz/NAME_fuzz.dict) whose tokens mutations insert
// --crash-dir DIR where an input that crashes or hangs is written (default: the current directory)
// --timeout-s T   an input that runs longer than T seconds counts as a hang (default 10)
// --verbose       announce every input before it runs
//
// On a crash (a signal: SIGSEGV, SIGABRT from a failed check or an uncaught exception, SIGFPE,
// ...) or a hang, it prints which input it was (file, or seed and index with the command that
// reproduces it), writes the input to DIR/crash-NAME-seed-S-mutation-I, and dies of the same
// signal, which is what fails the test. The last line of a clean run is
//   fuzz NAME: C corpus inputs, M mutations ran
// Exit status: 0 when every input ran, 1 when an argument is wrong or no input was found.
#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

#ifndef LLMCTL_FUZZ_NAME
#define LLMCTL_FUZZ_NAME "target"
#endif

namespace {

constexpr char kName[] = LLMCTL_FUZZ_NAME;

// A mutated input is cut at this size: the corpora's inputs are at most a few KB, like the
// -max_len=4096 the libFuzzer runs use, and a parser's cost grows with its input.
constexpr size_t kMaxMutatedBytes = 8192;

// What the crash handler reports: set before each input runs, read only from the handler (with
// async-signal-safe calls). The message is formatted before the input runs, so the handler only
// writes bytes.
struct Current {
  const uint8_t* data = nullptr;
  size_t size = 0;
  char announcement[1024] = {};  // "replay: mutation 17 (seed 1, 230 bytes)\n"
  char crash_path[1024] = {};    // "" for a corpus file, which is already on disk
  char reproduce[2048] = {};     // "reproduce: ... --seed 1 --only 17 CORPUS\n"
};
Current current;

void WriteAll(int fd, const char* text, size_t size) {
  while (size > 0) {
    const ssize_t written = ::write(fd, text, size);
    if (written <= 0) return;
    text += written;
    size -= static_cast<size_t>(written);
  }
}

void WriteText(int fd, const char* text) { WriteAll(fd, text, std::strlen(text)); }

// Reports the input that was running, keeps it on disk, and dies of the same signal (default
// action restored by SA_RESETHAND), so the test fails as a crash does without this handler.
const char* SignalName(int signal_number) {
  switch (signal_number) {
    case SIGSEGV:
      return "SIGSEGV";
    case SIGBUS:
      return "SIGBUS";
    case SIGFPE:
      return "SIGFPE";
    case SIGILL:
      return "SIGILL";
    case SIGABRT:
      return "SIGABRT";
    default:
      return "signal";
  }
}

void OnFatalSignal(int signal_number) {
  if (signal_number == SIGALRM) {
    WriteText(STDERR_FILENO, "replay: HANG (over --timeout-s) in ");
  } else {
    WriteText(STDERR_FILENO, "replay: CRASH (");
    WriteText(STDERR_FILENO, SignalName(signal_number));
    WriteText(STDERR_FILENO, ") in ");
  }
  WriteText(STDERR_FILENO, current.announcement + std::strlen("replay: "));
  if (current.crash_path[0] != '\0' && current.data != nullptr) {
    const int fd = ::open(current.crash_path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd >= 0) {
      WriteAll(fd, reinterpret_cast<const char*>(current.data), current.size);
      ::close(fd);
      WriteText(STDERR_FILENO, "replay: the input is in ");
      WriteText(STDERR_FILENO, current.crash_path);
      WriteText(STDERR_FILENO, "\n");
    }
  }
  WriteText(STDERR_FILENO, current.reproduce);
  // A hang dies of SIGABRT (reported once: its handler is reset first), as a failed check does.
  if (signal_number == SIGALRM) {
    ::signal(SIGABRT, SIG_DFL);
    ::raise(SIGABRT);
  }
  ::raise(signal_number);
}

void InstallHandlers() {
  struct sigaction action = {};
  action.sa_handler = OnFatalSignal;
  action.sa_flags = SA_RESETHAND | SA_NODEFER;
  sigemptyset(&action.sa_mask);
  for (int signal_number : {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT, SIGALRM}) {
    sigaction(signal_number, &action, nullptr);
  }
}

// splitmix64: a small, fast, well-mixed PRNG; its whole state is one 64-bit word, so a mutation's
// generator is made from (seed, index) alone.
class Random {
 public:
  explicit Random(uint64_t state) : state_(state) {}
  uint64_t Next() {
    uint64_t z = (state_ += 0x9E3779B97F4A7C15ULL);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
  }
  // Uniform enough in [0, bound) for bound > 0.
  size_t Below(size_t bound) { return static_cast<size_t>(Next() % bound); }
  bool OneIn(size_t n) { return Below(n) == 0; }

 private:
  uint64_t state_;
};

// Text that trips size arithmetic and number parsing: the limits of the integer types and their
// neighbours, powers of two whose products wrap, and doubles that are not finite or not normal.
constexpr std::string_view kEdgeNumbers[] = {"0",
                                             "-1",
                                             "1",
                                             "2",
                                             "255",
                                             "256",
                                             "65535",
                                             "65536",
                                             "4294967295",
                                             "4294967296",
                                             "4294967297",
                                             "2147483647",
                                             "2147483648",
                                             "-2147483648",
                                             "9223372036854775807",
                                             "9223372036854775808",
                                             "-9223372036854775808",
                                             "18446744073709551615",
                                             "18446744073709551616",
                                             "1e308",
                                             "1e309",
                                             "-1e309",
                                             "1e-320",
                                             "nan",
                                             "inf",
                                             "-inf",
                                             ".inf",
                                             ".nan",
                                             "0x7fffffff",
                                             "1.5",
                                             "-0",
                                             "99999999999999999999999999999999"};

// A libFuzzer dictionary: one token a line, `"text"` or `name="text"`, with \\, \" and \xNN
// escapes; '#' starts a comment line.
std::optional<std::vector<std::string>> ReadDictionary(const std::filesystem::path& path) {
  std::ifstream in(path);
  if (!in) return std::nullopt;
  std::vector<std::string> tokens;
  std::string line;
  while (std::getline(in, line)) {
    const size_t open = line.find('"');
    const size_t close = line.rfind('"');
    if (line.empty() || line[0] == '#' || open == std::string::npos || close <= open) continue;
    std::string token;
    for (size_t i = open + 1; i < close; ++i) {
      if (line[i] != '\\' || i + 1 >= close) {
        token.push_back(line[i]);
      } else if (line[i + 1] == 'x' && i + 3 < close) {
        unsigned value = 0;
        std::from_chars(line.data() + i + 2, line.data() + i + 4, value, 16);
        token.push_back(static_cast<char>(value));
        i += 3;
      } else {
        token.push_back(line[++i]);
      }
    }
    if (!token.empty()) tokens.push_back(std::move(token));
  }
  return tokens;
}

// One mutation step on `data`; `corpus` gives splices their second input.
void MutateOnce(std::string& data, const std::vector<std::string>& corpus,
                const std::vector<std::string>& dictionary, Random& random) {
  const auto position = [&](bool may_be_end) {
    return data.empty() ? 0 : random.Below(data.size() + (may_be_end ? 1 : 0));
  };
  const auto random_bytes = [&](size_t count) {
    std::string bytes(count, '\0');
    for (char& c : bytes) c = static_cast<char>(random.Next());
    return bytes;
  };
  switch (random.Below(10)) {
    case 0:  // flip a bit
      if (!data.empty()) data[position(false)] ^= static_cast<char>(1u << random.Below(8));
      break;
    case 1:  // set a byte: often an ASCII one, since the parsers read text
      if (!data.empty()) {
        data[position(false)] =
            static_cast<char>(random.OneIn(2) ? 32 + random.Below(95) : random.Next());
      }
      break;
    case 2:  // insert a few random bytes
      data.insert(position(true), random_bytes(1 + random.Below(8)));
      break;
    case 3: {  // delete a range
      if (data.empty()) break;
      const size_t at = position(false);
      data.erase(at, 1 + random.Below(std::min<size_t>(data.size() - at, 64)));
      break;
    }
    case 4: {  // repeat a range where it is (nesting, long lists)
      if (data.empty()) break;
      const size_t at = position(false);
      const std::string range =
          data.substr(at, 1 + random.Below(std::min<size_t>(64, 1 + data.size() - at)));
      for (size_t copies = 1 + random.Below(4); copies > 0; --copies) data.insert(at, range);
      break;
    }
    case 5: {  // splice: this input's head, another's tail
      const std::string& other = corpus[random.Below(corpus.size())];
      const size_t head = position(true);
      const size_t tail = other.empty() ? 0 : random.Below(other.size() + 1);
      data = data.substr(0, head) + other.substr(tail);
      break;
    }
    case 6: {  // copy a range of another input in
      const std::string& other = corpus[random.Below(corpus.size())];
      if (other.empty()) break;
      const size_t from = random.Below(other.size());
      data.insert(position(true), other.substr(from, 1 + random.Below(64)));
      break;
    }
    case 7:  // a dictionary token, inserted or overwriting
    case 8: {
      const std::string_view token =
          !dictionary.empty() && random.OneIn(2)
              ? std::string_view(dictionary[random.Below(dictionary.size())])
              : kEdgeNumbers[random.Below(std::size(kEdgeNumbers))];
      const size_t at = position(true);
      if (random.OneIn(2) || at + token.size() > data.size()) {
        data.insert(at, token);
      } else {
        data.replace(at, token.size(), token);
      }
      break;
    }
    default: {  // a run of digits replaced by an edge-case number: the values the checks read
      const size_t start = data.find_first_of("0123456789", position(false));
      if (start == std::string::npos) break;
      const size_t end = std::min(data.find_first_not_of("0123456789.", start), data.size());
      data.replace(start, end - start, kEdgeNumbers[random.Below(std::size(kEdgeNumbers))]);
      break;
    }
  }
  if (data.size() > kMaxMutatedBytes) data.resize(kMaxMutatedBytes);
}

// Mutation `index` of `seed`: a corpus input changed by 1 to 8 steps, from a generator of its own.
std::string Mutation(uint64_t seed, uint64_t index, const std::vector<std::string>& corpus,
                     const std::vector<std::string>& dictionary) {
  Random random(seed * 0xD1B54A32D192ED03ULL ^ index);
  random.Next();
  std::string data = corpus[random.Below(corpus.size())];
  for (size_t steps = 1 + random.Below(8); steps > 0; --steps) {
    MutateOnce(data, corpus, dictionary, random);
  }
  return data;
}

bool ReadFile(const std::filesystem::path& path, std::string* contents) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return false;
  contents->assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  return !in.bad();
}

std::optional<uint64_t> ParseCount(std::string_view text) {
  uint64_t value = 0;
  const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (error != std::errc() || end != text.data() + text.size() || text.empty()) return std::nullopt;
  return value;
}

void RunOne(const std::string& data, bool announce, unsigned timeout_s) {
  current.data = reinterpret_cast<const uint8_t*>(data.data());
  current.size = data.size();
  if (announce) WriteText(STDERR_FILENO, current.announcement);
  ::alarm(timeout_s);
  LLVMFuzzerTestOneInput(current.data, current.size);
  ::alarm(0);
}

int Usage(const char* program, const char* problem) {
  std::fprintf(stderr,
               "replay: %s\nusage: %s [--mutations N] [--seed S] [--dict FILE] [--only I] "
               "[--crash-dir DIR] [--timeout-s T] [--verbose] DIR_OR_FILE...\n",
               problem, program);
  return 1;
}

// The command line, parsed.
struct Replay {
  const char* program = "";
  uint64_t mutations = 0, seed = 1, timeout_s = 10;
  std::optional<uint64_t> only;
  std::filesystem::path dictionary_path, crash_dir = ".";
  bool verbose = false;
  std::vector<std::filesystem::path> inputs;  // the corpus' files, sorted
  std::string corpus_args;                    // as given, for the reproduce line
};

// Adds the file `arg` names, or each regular file in the directory it names. False after saying
// why.
bool AddInputs(const char* arg, Replay* replay) {
  namespace fs = std::filesystem;
  const fs::path path = arg;
  replay->corpus_args.append(" ").append(arg);
  std::error_code ec;
  if (fs::is_directory(path, ec)) {
    for (const fs::directory_entry& entry : fs::directory_iterator(path, ec)) {
      if (entry.is_regular_file(ec)) replay->inputs.push_back(entry.path());
    }
    if (ec) {
      std::fprintf(stderr, "replay: cannot list %s: %s\n", arg, ec.message().c_str());
      return false;
    }
  } else if (fs::is_regular_file(path, ec)) {
    replay->inputs.push_back(path);
  } else {
    std::fprintf(stderr, "replay: %s is neither a file nor a directory\n", arg);
    return false;
  }
  return true;
}

// Parses the command line into `replay`; an exit status when it is wrong.
std::optional<int> ParseArgs(int argc, char** argv, Replay* replay) {
  replay->program = argv[0];
  for (int i = 1; i < argc; ++i) {
    const std::string_view arg = argv[i];
    if (arg == "--verbose") {
      replay->verbose = true;
      continue;
    }
    if (arg == "--mutations" || arg == "--seed" || arg == "--only" || arg == "--timeout-s" ||
        arg == "--dict" || arg == "--crash-dir") {
      if (i + 1 >= argc) return Usage(argv[0], (std::string(arg) + " needs a value").c_str());
      const std::string_view value = argv[++i];
      if (arg == "--dict") {
        replay->dictionary_path = value;
      } else if (arg == "--crash-dir") {
        replay->crash_dir = value;
      } else {
        const std::optional<uint64_t> number = ParseCount(value);
        if (!number) {
          return Usage(argv[0], (std::string(arg) + ": expected a non-negative integer, got '" +
                                 std::string(value) + "'")
                                    .c_str());
        }
        if (arg == "--mutations") replay->mutations = *number;
        if (arg == "--seed") replay->seed = *number;
        if (arg == "--only") replay->only = *number;
        if (arg == "--timeout-s") replay->timeout_s = std::clamp<uint64_t>(*number, 1, 3600);
      }
      continue;
    }
    if (arg.starts_with("--")) {
      return Usage(argv[0], ("unknown option " + std::string(arg)).c_str());
    }
    if (!AddInputs(argv[i], replay)) return 1;
  }
  if (replay->inputs.empty()) return Usage(argv[0], "no inputs");
  std::sort(replay->inputs.begin(), replay->inputs.end());
  return std::nullopt;
}

// Runs every corpus file, each announced; false if one cannot be read.
bool ReplayCorpus(const Replay& replay, std::vector<std::string>* corpus) {
  corpus->resize(replay.inputs.size());
  for (size_t i = 0; i < replay.inputs.size(); ++i) {
    const std::filesystem::path& input = replay.inputs[i];
    if (!ReadFile(input, &(*corpus)[i])) {
      std::fprintf(stderr, "replay: cannot read %s\n", input.c_str());
      return false;
    }
    std::snprintf(current.announcement, sizeof(current.announcement), "replay: %s (%zu bytes)\n",
                  input.c_str(), (*corpus)[i].size());
    current.crash_path[0] = '\0';  // the file itself reproduces it
    std::snprintf(current.reproduce, sizeof(current.reproduce), "reproduce: %s %s\n",
                  replay.program, input.c_str());
    RunOne((*corpus)[i], /*announce=*/true, static_cast<unsigned>(replay.timeout_s));
  }
  return true;
}

// Runs mutations [first, end) of the corpus, each with the file a crash is written to and the
// command that reproduces it set before it runs.
void ReplayMutations(const Replay& replay, const std::vector<std::string>& corpus,
                     const std::vector<std::string>& dictionary, uint64_t first, uint64_t end) {
  const auto seed = static_cast<unsigned long long>(replay.seed);
  if (end > first) {
    std::fprintf(stderr,
                 "replay: mutations %llu to %llu of seed %llu (a crash or hang names its "
                 "mutation; --verbose announces each)\n",
                 static_cast<unsigned long long>(first), static_cast<unsigned long long>(end - 1),
                 seed);
  }
  for (uint64_t index = first; index < end; ++index) {
    const std::string data = Mutation(replay.seed, index, corpus, dictionary);
    const auto mutation = static_cast<unsigned long long>(index);
    std::snprintf(current.announcement, sizeof(current.announcement),
                  "replay: mutation %llu (seed %llu, %zu bytes)\n", mutation, seed, data.size());
    std::snprintf(current.crash_path, sizeof(current.crash_path),
                  "%s/crash-%s-seed-%llu-mutation-%llu", replay.crash_dir.c_str(), kName, seed,
                  mutation);
    std::snprintf(current.reproduce, sizeof(current.reproduce),
                  "reproduce: %s%s%s --seed %llu --only %llu%s\n", replay.program,
                  replay.dictionary_path.empty() ? "" : " --dict ", replay.dictionary_path.c_str(),
                  seed, mutation, replay.corpus_args.c_str());
    RunOne(data, replay.verbose, static_cast<unsigned>(replay.timeout_s));
  }
}

}  // namespace

int main(int argc, char** argv) {
  Replay replay;
  if (const std::optional<int> stop = ParseArgs(argc, argv, &replay)) return *stop;
  std::vector<std::string> dictionary;
  if (!replay.dictionary_path.empty()) {
    std::optional<std::vector<std::string>> read = ReadDictionary(replay.dictionary_path);
    if (!read) {
      std::fprintf(stderr, "replay: cannot read the dictionary %s\n",
                   replay.dictionary_path.c_str());
      return 1;
    }
    dictionary = std::move(*read);
  }
  InstallHandlers();
  std::vector<std::string> corpus;
  if (!ReplayCorpus(replay, &corpus)) return 1;
  const uint64_t first = replay.only.value_or(0);
  const uint64_t end = replay.only ? *replay.only + 1 : replay.mutations;
  ReplayMutations(replay, corpus, dictionary, first, end);
  std::fprintf(stderr, "fuzz %s: %zu corpus inputs, %llu mutations ran\n", kName, corpus.size(),
               static_cast<unsigned long long>(end - first));
  return 0;
}
