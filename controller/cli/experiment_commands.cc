// llmctl status, watch, cancel, resume, report and fetch: one experiment's state and results.
#include <algorithm>
#include <filesystem>
#include <memory>
#include <optional>
#include <thread>

#include "common/atomic_file.h"
#include "common/files.h"
#include "common/text.h"
#include "controller/cli/artifact_file.h"
#include "controller/cli/client.h"
#include "controller/cli/interrupt_note.h"
#include "controller/cli/llmctl.h"
#include "controller/cli/report.h"
#include "controller/cli/watch_view.h"
#include "rpc/grpc_status.h"
#include "rpc/transfer.h"

namespace llmctl::cli {
namespace {

namespace fs = std::filesystem;

constexpr int kWatchReconnects = 30;

// InvalidArgument for a TRIAL argument that is not UTF-8: no trial has such a name (experiment
// files are UTF-8), and the request's proto3 string could not carry it.
Status CheckTrialArgument(const std::string& trial) {
  if (FirstInvalidUtf8(trial) == std::string::npos) return Status::Ok();
  return InvalidArgumentError("trial '" + OnOneLine(trial) +
                              "' is not UTF-8 text, which every trial's name is");
}

// Whether the terminal moves its cursor as watch's redraw asks: a dumb one (Emacs' shell, a CI
// log) or an unknown one would show the escape sequences as text.
bool MovesTheCursor(const EnvLookup& env) {
  const std::optional<std::string> term = env("TERM");
  return term.has_value() && *term != "dumb";
}

// What Ctrl-C says while llmctl follows experiment `id`: that the experiment goes on running, and
// how to follow or cancel it. Watch's id 0 is the latest experiment, whose number its first line
// shows.
std::string FollowInterruptedNote(int64_t id) {
  const std::string number = id == 0 ? "ID" : std::to_string(id);
  std::string note = "\nllmctl: interrupted; ";
  note += id == 0 ? "the experiment" : "experiment " + number;
  note += " goes on running: `llmctl watch " + number + "` follows it again, `llmctl cancel ";
  note += number + "` cancels it\n";
  return note;
}

}  // namespace

StatusOr<v1::ExperimentStatus> Llmctl::Follow(v1::Controller::Stub& stub, int64_t id) {
  WatchPrinter printer(context_.out_is_tty && MovesTheCursor(context_.env));
  std::optional<v1::ExperimentStatus> last;
  for (int reconnects = 0;; ++reconnects) {
    grpc::ClientContext call;
    v1::GetExperimentRequest request;
    request.set_experiment_id(id);
    std::unique_ptr<grpc::ClientReader<v1::ExperimentStatus>> reader = stub.Watch(&call, request);
    v1::ExperimentStatus status;
    while (reader->Read(&status)) {
      context_.out << printer.Update(status) << std::flush;
      last = status;
    }
    const Status finished = rpc::FromGrpcStatus(reader->Finish());
    if (finished.ok()) {
      if (last) return *last;
      return InternalError("the controller ended the watch of experiment " + std::to_string(id) +
                           " without a status");
    }
    // The controller's NotFound names the experiment itself; id 0 is "the latest", no
    // experiment's number ("watching experiment 0: no experiment has been submitted yet").
    if (finished.code() == StatusCode::kNotFound) return finished;
    if (finished.code() != StatusCode::kUnavailable || reconnects == kWatchReconnects) {
      return finished.WithContext("watching experiment " + std::to_string(id));
    }
    std::this_thread::sleep_for(context_.watch_retry_interval);
  }
}

int Llmctl::FollowAndReport(v1::Controller::Stub& stub, int64_t id) {
  const InterruptNote interrupted(FollowInterruptedNote(id));
  StatusOr<v1::ExperimentStatus> followed = Follow(stub, id);
  if (!followed.ok()) return Fail(followed.status());
  v1::GetExperimentRequest report_request;
  report_request.set_experiment_id(id);
  v1::ReportResponse report;
  const Status reported =
      rpc::FromGrpcStatus(stub.Report(UnaryContext().get(), report_request, &report));
  if (!reported.ok()) return Fail(reported);
  context_.out << "\n" << RenderReport(report, ReportFormat::kTable);
  return CountUnexpectedOutcomes(report) > 0 ? kExitFailed : kExitOk;
}

int Llmctl::ShowStatus(int64_t id) {
  StatusOr<std::unique_ptr<v1::Controller::Stub>> stub = Connect();
  if (!stub.ok()) return Fail(stub.status());
  if (id == 0) {
    v1::ListExperimentsResponse list;
    const Status listed = rpc::FromGrpcStatus(
        (*stub)->ListExperiments(UnaryContext().get(), v1::ListExperimentsRequest(), &list));
    if (!listed.ok()) return Fail(listed);
    if (list.experiments().empty()) {
      context_.out << "no experiments yet; llmctl submit FILE.yaml starts one\n";
      return kExitOk;
    }
    std::vector<std::vector<std::string>> rows = {
        {"id", "name", "state", "ended", "created", "file"}};
    for (const v1::ExperimentSummary& e : list.experiments()) {
      // The controller's words, each on the table's one line.
      rows.push_back({std::to_string(e.id()), OnOneLine(e.name()), OnOneLine(e.state()),
                      std::to_string(e.ended()) + "/" + std::to_string(e.trials()),
                      FormatUnixTime(e.created_unix()), OnOneLine(e.filename())});
    }
    context_.out << FormatColumns(rows);
    return kExitOk;
  }
  v1::GetExperimentRequest request;
  request.set_experiment_id(id);
  v1::ExperimentStatus status;
  const Status got =
      rpc::FromGrpcStatus((*stub)->GetExperiment(UnaryContext().get(), request, &status));
  if (!got.ok()) return Fail(got);
  context_.out << "experiment " << status.id() << " " << OnOneLine(status.name()) << ": "
               << OnOneLine(status.state()) << "\n";
  for (const std::string& line : WatchLines(status)) context_.out << line << "\n";
  return kExitOk;
}

int Llmctl::Watch(int64_t id) {
  StatusOr<std::unique_ptr<v1::Controller::Stub>> stub = Connect();
  if (!stub.ok()) return Fail(stub.status());
  // Ctrl-C is how a watch usually ends: said, so that no one takes it for a cancel.
  const InterruptNote interrupted(FollowInterruptedNote(id));
  StatusOr<v1::ExperimentStatus> followed = Follow(**stub, id);
  if (!followed.ok()) return Fail(followed.status());
  return kExitOk;
}

int Llmctl::Cancel(int64_t id, const std::string& trial, bool checkpoint) {
  if (Status checked = CheckTrialArgument(trial); !checked.ok()) return Fail(checked);
  StatusOr<std::unique_ptr<v1::Controller::Stub>> stub = Connect();
  if (!stub.ok()) return Fail(stub.status());
  v1::CancelRequest request;
  request.set_experiment_id(id);
  request.set_trial(trial);
  request.set_checkpoint(checkpoint);
  v1::CancelResponse response;
  const Status cancelled =
      rpc::FromGrpcStatus((*stub)->Cancel(UnaryContext().get(), request, &response));
  if (!cancelled.ok()) return Fail(cancelled);
  if (response.cancelled().empty()) {
    context_.out << "nothing to cancel: " << (trial.empty() ? "every trial" : OnOneLine(trial))
                 << " had already ended\n";
  }
  for (const std::string& name : response.cancelled()) {
    context_.out << "cancelled " << OnOneLine(name) << "\n";
  }
  if (checkpoint && !response.cancelled().empty()) {
    const std::string ids = std::to_string(id);
    context_.out << "running trials first checkpoint their last complete step: `llmctl status " +
                        ids + "` says where, `llmctl resume " + ids + " TRIAL` continues from it\n";
  }
  return kExitOk;
}

int Llmctl::Resume(int64_t id, const std::string& trial, bool wait) {
  if (Status checked = CheckTrialArgument(trial); !checked.ok()) return Fail(checked);
  StatusOr<std::unique_ptr<v1::Controller::Stub>> stub = Connect();
  if (!stub.ok()) return Fail(stub.status());
  v1::ResumeRequest request;
  request.set_experiment_id(id);
  request.set_trial(trial);
  v1::ResumeResponse response;
  const Status resumed =
      rpc::FromGrpcStatus((*stub)->Resume(UnaryContext().get(), request, &response));
  // A trial that cannot be resumed is the caller's mistake, like an unknown one: nothing changed.
  if (resumed.code() == StatusCode::kFailedPrecondition) {
    context_.err << "llmctl: cannot resume: " << ForTerminal(resumed.message()) << "\n";
    return kExitInvalidInput;
  }
  if (!resumed.ok()) return Fail(resumed);
  context_.out << "resuming " << OnOneLine(response.trial()) << " of experiment "
               << response.experiment_id() << " at step " << response.first_step() + 1
               << " from attempt " << response.resumes_attempt() << "'s checkpoint "
               << OnOneLine(response.checkpoint()) << " on node " << OnOneLine(response.node())
               << (response.checkpoint_copied()
                       ? " (the controller has a copy: any node that can run it may continue it)"
                       : "")
               << "\n"
               << std::flush;
  if (!wait) return kExitOk;
  return FollowAndReport(**stub, response.experiment_id());
}

int Llmctl::Report(int64_t id, const std::string& format_name, const std::string& output) {
  StatusOr<ReportFormat> format = ParseReportFormat(format_name);
  if (!format.ok()) return Fail(format.status());
  // A directory is a wrong flag, said before anything is asked: the write failed after the report
  // came, "cannot write DIR: rename to DIR: Is a directory" and exit 1.
  std::error_code not_checked;
  if (!output.empty() && std::filesystem::is_directory(output, not_checked)) {
    return Fail(InvalidArgumentError("--output " + output +
                                     " is a directory; name a file to write the report to"));
  }
  StatusOr<std::unique_ptr<v1::Controller::Stub>> stub = Connect();
  if (!stub.ok()) return Fail(stub.status());
  v1::GetExperimentRequest request;
  request.set_experiment_id(id);
  v1::ReportResponse report;
  const Status got = rpc::FromGrpcStatus((*stub)->Report(UnaryContext().get(), request, &report));
  if (!got.ok()) return Fail(got);
  const std::string text = RenderReport(report, *format);
  if (output.empty()) {
    context_.out << text;
    return kExitOk;
  }
  // What an earlier report to the same file left when Ctrl-C or kill -9 ended it mid-write.
  (void)RemoveAtomicWriteLeftoversOfEndedWriters(output);
  const Status written =
      WriteFileAtomically(output, [&](int fd) { return WriteAll(fd, text.data(), text.size()); });
  // The local file's error is this machine's (a full disk, a missing directory), never the
  // controller's: written's Unavailable would have Fail ask whether the controller is running.
  if (!written.ok()) {
    return Fail(FailedPreconditionError("--output " + output + ": " + written.message()));
  }
  context_.err << "wrote " << output << "\n";
  return kExitOk;
}

int Llmctl::Fetch(int64_t id, const std::string& trial, const std::string& to) {
  if (Status checked = CheckTrialArgument(trial); !checked.ok()) return Fail(checked);
  std::string safe_trial = trial;  // sweep trials are named "base/key=value"
  std::replace(safe_trial.begin(), safe_trial.end(), '/', '_');
  const fs::path destination =
      to.empty() ? fs::path("llmctl-" + std::to_string(id) + "-" + safe_trial) : fs::path(to);
  // A file is a wrong flag, said before anything is asked: the first artifact's write failed
  // once the stream had begun, exit 1.
  std::error_code not_checked;
  if (fs::exists(destination, not_checked) && !fs::is_directory(destination, not_checked)) {
    return Fail(InvalidArgumentError("--to " + destination.string() +
                                     " is not a directory; name a directory to fetch into"));
  }
  StatusOr<std::unique_ptr<v1::Controller::Stub>> stub = Connect();
  if (!stub.ok()) return Fail(stub.status());

  // The artifacts' total size is not known up front: no call deadline, an idle limit instead.
  grpc::ClientContext call;
  rpc::IdleCanceller idle(call, kCallDeadline);
  v1::FetchTrialArtifactsRequest request;
  request.set_experiment_id(id);
  request.set_trial(trial);
  std::unique_ptr<grpc::ClientReader<v1::ArtifactChunk>> reader =
      (*stub)->FetchArtifacts(&call, request);
  auto abort = [&](const Status& status) {
    call.TryCancel();
    reader->Finish().ok();
    return Fail(status);
  };
  std::unique_ptr<ArtifactFile> current;
  int files = 0;
  int64_t total = 0;
  v1::ArtifactChunk chunk;
  while (reader->Read(&chunk)) {
    idle.Progress();
    if (current == nullptr) {
      StatusOr<std::unique_ptr<ArtifactFile>> begun = ArtifactFile::Begin(destination, chunk);
      if (!begun.ok()) return abort(begun.status());
      current = std::move(*begun);
    }
    if (Status appended = current->Append(chunk.data()); !appended.ok()) return abort(appended);
    if (!chunk.last()) continue;
    if (Status finished = current->Finish(chunk.sha256()); !finished.ok()) return abort(finished);
    ++files;
    total += current->size();
    current.reset();
  }
  const Status finished = idle.Explain(reader->Finish(), "fetching the artifacts");
  if (!finished.ok()) return Fail(finished);
  if (current != nullptr) {
    return Fail(DataLossError(current->path() + ": the stream ended in the middle of the file"));
  }
  context_.out << "fetched " << CountOf(files, "file", "files") << " ("
               << CountOf(total, "byte", "bytes") << ", sha256 checked) into "
               << destination.string() << "\n";
  return kExitOk;
}

}  // namespace llmctl::cli
