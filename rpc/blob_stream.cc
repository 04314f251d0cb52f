#include "rpc/blob_stream.h"

#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "rpc/grpc_status.h"

namespace llmctl::rpc {
namespace {

// read(2), retried when a signal interrupted it: bytes read, 0 at the end, -1 on an error.
ssize_t ReadSome(int fd, char* buffer, size_t capacity) {
  while (true) {
    const ssize_t n = read(fd, buffer, capacity);
    if (n >= 0 || errno != EINTR) return n;
  }
}

}  // namespace

Status SendBlob(grpc::ClientWriterInterface<v1::BlobChunk>& writer, grpc::ClientContext& context,
                const OutgoingBlob& blob, size_t chunk_bytes, int64_t* bytes_sent) {
  std::string buffer(chunk_bytes, '\0');
  v1::BlobChunk chunk;
  chunk.set_sha256(blob.sha256);
  chunk.set_size(blob.size);
  bool first = true;
  while (true) {
    const ssize_t n = ReadSome(blob.fd, buffer.data(), buffer.size());
    if (n < 0) {
      const std::string reason = std::strerror(errno);
      context.TryCancel();
      writer.Finish().ok();
      return DataLossError("read failed during the upload: " + reason);
    }
    if (n == 0 && !first) break;
    chunk.set_data(buffer.data(), static_cast<size_t>(n));
    if (!writer.Write(chunk)) break;  // the receiver ended the call; Finish says why
    if (bytes_sent != nullptr) *bytes_sent += n;
    if (n == 0) break;  // an empty blob: its one chunk is sent
    chunk.clear_sha256();
    chunk.clear_size();
    first = false;
  }
  writer.WritesDone();
  return FromGrpcStatus(writer.Finish());
}

StatusOr<v1::BlobChunk> ReadFirstBlobChunk(grpc::ServerReaderInterface<v1::BlobChunk>& reader) {
  v1::BlobChunk first;
  if (!reader.Read(&first)) return InvalidArgumentError("upload: the stream carried no chunk");
  return first;
}

Status DrainHeldBlob(grpc::ServerReaderInterface<v1::BlobChunk>& reader, const v1::BlobChunk& first,
                     int64_t held_bytes) {
  if (first.size() != held_bytes) {
    return InvalidArgumentError("upload of " + first.sha256() + ": announced " +
                                std::to_string(first.size()) + " bytes, where the blob of that " +
                                "digest held here has " + std::to_string(held_bytes));
  }
  auto received = static_cast<int64_t>(first.data().size());
  v1::BlobChunk chunk;
  while (received <= held_bytes && reader.Read(&chunk)) {
    received += static_cast<int64_t>(chunk.data().size());
  }
  if (received > held_bytes) {
    return InvalidArgumentError("upload of " + first.sha256() + ": more than the " +
                                std::to_string(held_bytes) + " bytes it announced");
  }
  return Status::Ok();
}

Status ReceiveBlob(grpc::ServerReaderInterface<v1::BlobChunk>& reader, v1::BlobChunk first,
                   digest::VerifiedFileWriter& file) {
  const std::string sha256 = first.sha256();
  v1::BlobChunk chunk = std::move(first);
  do {
    if (!chunk.sha256().empty() && chunk.sha256() != sha256) {
      return InvalidArgumentError("upload of " + sha256 + ": a later chunk names another blob");
    }
    RETURN_IF_ERROR(file.Append(chunk.data()));
  } while (reader.Read(&chunk));
  return file.Commit(sha256);
}

}  // namespace llmctl::rpc
