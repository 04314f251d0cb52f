// Both ends of the blob upload stream (v1::BlobChunk, common.proto): the CLI sends blobs to
// llmctld, and llmctld sends them on to llm-agent, the same way.
//
// The first chunk carries the blob's sha256 and size, even for an empty blob; the others carry
// data and no name (or the same name). The receiver hashes what arrives and publishes the blob
// only when digest and size are those announced (digest::VerifiedFileWriter).
#ifndef LLMCTL_RPC_BLOB_STREAM_H_
#define LLMCTL_RPC_BLOB_STREAM_H_

#include <grpcpp/client_context.h>
#include <grpcpp/support/sync_stream.h>

#include <cstddef>
#include <cstdint>
#include <string>

#include "common/digest/verified_file.h"
#include "common/status.h"
#include "llmctl/v1/common.pb.h"

namespace llmctl::rpc {

// The blob to send: its name and size, and an open descriptor positioned at its first byte, read
// until its end.
struct OutgoingBlob {
  std::string sha256;
  int64_t size = 0;
  int fd = -1;
};

// Sends `blob` on `writer`, the stream of an UploadBlob call made with `context`, in chunks of
// `chunk_bytes`, and finishes the call. Adds the bytes the receiver took to `*bytes_sent` when it
// is not null. A receiver that ends the call early (it has the blob already, or refuses it) is
// answered by Finish: its status is returned. DataLoss when the file cannot be read (the caller
// names it); the call is cancelled then, so the receiver publishes nothing.
Status SendBlob(grpc::ClientWriterInterface<v1::BlobChunk>& writer, grpc::ClientContext& context,
                const OutgoingBlob& blob, size_t chunk_bytes, int64_t* bytes_sent = nullptr);

// The receiving end, in two steps so that the receiver can look the blob up in between:
//   ASSIGN_OR_RETURN(v1::BlobChunk first, ReadFirstBlobChunk(*reader));
//   if (store.Has(first.sha256())) {
//     ...already_present...; return DrainHeldBlob(*reader, first, held blob's size);
//   }
//   ASSIGN_OR_RETURN(auto file, store.BeginWrite(first.sha256(), first.size()));
//   return ReceiveBlob(*reader, first, *file);

// The stream's first chunk. InvalidArgument when the stream carried none.
StatusOr<v1::BlobChunk> ReadFirstBlobChunk(grpc::ServerReaderInterface<v1::BlobChunk>& reader);

// For a receiver that holds the blob already, `held_bytes` long: reads the rest of the stream, up
// to that size. A stream left unread can leave the sender's writes waiting on flow control; one
// that announces another size (a digest names one content, so one size) or goes on past it is
// refused (InvalidArgument) rather than read for as long as the sender says or writes.
Status DrainHeldBlob(grpc::ServerReaderInterface<v1::BlobChunk>& reader, const v1::BlobChunk& first,
                     int64_t held_bytes);

// Appends `first` and every later chunk to `file`, then commits it under `first`'s sha256 (which
// checks size and digest). InvalidArgument when a later chunk names another blob; the file's
// DataLoss when more bytes arrive than announced, or other bytes.
Status ReceiveBlob(grpc::ServerReaderInterface<v1::BlobChunk>& reader, v1::BlobChunk first,
                   digest::VerifiedFileWriter& file);

}  // namespace llmctl::rpc

#endif  // LLMCTL_RPC_BLOB_STREAM_H_
