#include "controller/dispatch/blob_delivery.h"

#include <spdlog/spdlog.h>
#include <sys/stat.h>

#include <set>

#include "common/byte_size.h"
#include "common/files.h"
#include "controller/dispatch/kept_work.h"
#include "controller/dispatch/unneeded_work.h"
#include "rpc/blob_stream.h"
#include "rpc/grpc_status.h"
#include "rpc/transfer.h"

namespace llmctl::controller::dispatch {

StatusOr<bool> BlobDeliveries::Ensure(AgentLinks::Link& link,
                                      const std::shared_ptr<v1::Agent::Stub>& stub,
                                      const digest::InputTree& tree, MonotonicTime now) {
  const Key key{link.name, tree.digest};
  UnneededWork<Delivery> done;
  bool ready = false;
  {
    MutexLock lock(core_.mutex);
    TakeUnneededWork(deliveries_, now, done);
    if (const auto entry = deliveries_.find(key); entry != deliveries_.end()) {
      entry->second->asked_at = now;
      switch (entry->second->state) {
        case Delivery::State::kRunning:
          return false;
        case Delivery::State::kReady:
          // Taken by this launch; a later one asks the agent again (its cache may have changed).
          ready = true;
          done.Add(std::move(entry->second));
          deliveries_.erase(entry);
          break;
        case Delivery::State::kIdle:
          if (now < entry->second->retry_at) return false;
          break;
      }
    }
  }
  if (ready) return true;
  ASSIGN_OR_RETURN(std::vector<Blob> missing, Missing(*stub, tree));
  int64_t bytes = 0;
  for (const Blob& blob : missing) bytes += blob.size;
  if (bytes <= core_.options.inline_upload_bytes) {
    RETURN_IF_ERROR(Send(*stub, missing, nullptr));
    // Delivered: a failed delivery's retry, if one was due, is no longer needed.
    {
      MutexLock lock(core_.mutex);
      if (const auto entry = deliveries_.find(key); entry != deliveries_.end()) {
        done.Add(std::move(entry->second));
        deliveries_.erase(entry);
      }
    }
    return true;
  }
  Delivery* delivery = nullptr;
  {
    MutexLock lock(core_.mutex);
    if (core_.stopping) return false;
    std::unique_ptr<Delivery>& entry = deliveries_[key];
    if (entry == nullptr) {
      entry = std::make_unique<Delivery>();
      entry->node = link.name;
      entry->tree_digest = tree.digest;
    }
    delivery = entry.get();
    delivery->asked_at = now;
    // ForgetNode came while the agent was asked: the next call starts afresh.
    if (delivery->forgotten) return false;
    delivery->state = Delivery::State::kRunning;
    delivery->bytes = bytes;
  }
  // Not running: any earlier thread has finished its work.
  if (delivery->thread.joinable()) delivery->thread.join();
  spdlog::info("node {}: sending {} of inputs ({} blobs) in the background", link.name,
               FormatBytes(static_cast<uint64_t>(bytes)), missing.size());
  delivery->thread = std::thread([this, delivery, stub, missing = std::move(missing)]() mutable {
    RunInBackground(*delivery, std::move(stub), std::move(missing));
  });
  return false;
}

void BlobDeliveries::RunInBackground(Delivery& delivery, std::shared_ptr<v1::Agent::Stub> stub,
                                     std::vector<Blob> blobs) {
  const Status sent = Send(*stub, blobs, &delivery);
  {
    MutexLock lock(core_.mutex);
    if (sent.ok()) {
      delivery.state = Delivery::State::kReady;
      delivery.backoff = std::chrono::milliseconds(0);
      delivery.last_failure.clear();
      spdlog::info("node {}: inputs sent ({})", delivery.node,
                   FormatBytes(static_cast<uint64_t>(delivery.bytes)));
    } else {
      delivery.state = Delivery::State::kIdle;
      delivery.backoff =
          NextBackoff(delivery.backoff, core_.options.backoff_initial, core_.options.backoff_max);
      delivery.retry_at = core_.clock.Monotonic() + delivery.backoff;
      delivery.last_failure = sent.message();
      spdlog::warn("node {}: sending inputs failed, trying again in {} ms: {}", delivery.node,
                   delivery.backoff.count(), sent.message());
    }
  }
  core_.Wake();
}

StatusOr<std::vector<BlobDeliveries::Blob>> BlobDeliveries::Missing(v1::Agent::Stub& stub,
                                                                    const digest::InputTree& tree) {
  v1::MissingBlobsRequest request;
  std::map<std::string, int64_t> offered;  // sha256 → size
  for (const digest::TreeFile& file : tree.files) {
    if (offered.emplace(file.sha256, file.size).second) request.add_sha256(file.sha256);
  }
  v1::MissingBlobsResponse response;
  auto context = core_.CallContext();
  RETURN_IF_ERROR(rpc::FromGrpcStatus(stub.MissingBlobs(context.get(), request, &response)));
  std::vector<Blob> missing;
  std::set<std::string> named;
  for (const std::string& sha256 : response.sha256()) {
    const auto it = offered.find(sha256);
    if (it == offered.end()) return InternalError("the agent asked for a blob it was not offered");
    if (named.insert(sha256).second) missing.push_back({sha256, it->second});
  }
  return missing;
}

Status BlobDeliveries::Send(v1::Agent::Stub& stub, const std::vector<Blob>& blobs,
                            Delivery* delivery) {
  for (const Blob& blob : blobs) {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() +
                         rpc::TransferDeadline(core_.options.call_deadline, blob.size,
                                               core_.options.min_transfer_bytes_per_second));
    if (delivery != nullptr) {
      MutexLock lock(core_.mutex);
      if (core_.stopping) return CancelledError("the controller is stopping");
      if (delivery->forgotten) return CancelledError("node " + delivery->node + " was removed");
      delivery->context = &context;
    }
    const Status uploaded = Upload(stub, blob, context);
    if (delivery != nullptr) {
      MutexLock lock(core_.mutex);
      delivery->context = nullptr;
    }
    RETURN_IF_ERROR(uploaded);
  }
  return Status::Ok();
}

Status BlobDeliveries::Upload(v1::Agent::Stub& stub, const Blob& blob,
                              grpc::ClientContext& context) {
  const std::string path = core_.blobs.PathOf(blob.sha256);
  struct stat info {};
  const StatusOr<UniqueFd> fd = OpenRegularFile(path, info);
  if (!fd.ok()) {
    return DataLossError("blob " + blob.sha256 +
                         " is gone from the store: " + fd.status().message());
  }
  v1::UploadBlobResponse response;
  auto writer = stub.UploadBlob(&context, &response);
  const Status sent =
      rpc::SendBlob(*writer, context, {.sha256 = blob.sha256, .size = blob.size, .fd = fd->get()},
                    static_cast<size_t>(core_.options.upload_chunk_bytes));
  return sent.WithContext("UploadBlob " + blob.sha256);
}

std::string BlobDeliveries::WaitingFor(const std::string& node, const std::string& tree_digest) {
  MutexLock lock(core_.mutex);
  const auto it = deliveries_.find({node, tree_digest});
  if (it == deliveries_.end()) return "";
  const Delivery& delivery = *it->second;
  if (delivery.state == Delivery::State::kRunning) {
    return "sending " + FormatBytes(static_cast<uint64_t>(delivery.bytes)) + " of inputs to node " +
           node;
  }
  if (delivery.state == Delivery::State::kIdle && !delivery.last_failure.empty()) {
    return "sending inputs to node " + node + " failed, trying again: " + delivery.last_failure;
  }
  return "";
}

void BlobDeliveries::ForgetNode(const std::string& node) {
  MutexLock lock(core_.mutex);
  ForgetNodesWork(deliveries_, node);
}

int BlobDeliveries::Held() {
  MutexLock lock(core_.mutex);
  return static_cast<int>(deliveries_.size());
}

int BlobDeliveries::InFlight() {
  MutexLock lock(core_.mutex);
  return RunningWork(deliveries_);
}

void BlobDeliveries::Stop() {
  MutexLock lock(core_.mutex);
  const std::vector<Delivery*> deliveries = CancelAllWork(deliveries_);
  lock.Unlock();
  JoinWork(deliveries);
}

}  // namespace llmctl::controller::dispatch
