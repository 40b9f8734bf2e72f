// The C++ client of hsapd: a session, shared buffers, and the attention calls.
//
//   auto client = hsap::client::Client::Connect("/run/hsap/hsapd.sock");
//   auto buf = (*client)->CreateBuffer(bytes, "trainer0");   // memfd, registered
//   hsap::v1::AttentionForwardRequest req;
//   *req.mutable_q() = buf->Ref(q_offset, {T, Hq, D}, hsap::v1::DTYPE_BFLOAT16);
//   ...
//   auto resp = (*client)->Forward(req);
//
// A Client owns one session (the connection to "<socket>.session") and one
// gRPC channel to "unix:<socket>". Destroying it closes the session; the
// daemon then drops every region the session registered.
// Thread-safe for concurrent calls; CreateBuffer serialises on the session.
#ifndef HSAP_CLIENT_CPP_HSAP_CLIENT_H_
#define HSAP_CLIENT_CPP_HSAP_CLIENT_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "common/unique_fd.h"
#include "grpcpp/channel.h"
#include "hsap/v1/attention.grpc.pb.h"
#include "hsap/v1/cluster.grpc.pb.h"
#include "hsap/v1/regions.grpc.pb.h"

namespace hsap::client {

class Client;

// A memfd mapped in this process and registered with the daemon.
class SharedBuffer {
 public:
  ~SharedBuffer();  // unmaps locally; the daemon keeps its mapping until unregistered
  SharedBuffer(const SharedBuffer&) = delete;
  SharedBuffer& operator=(const SharedBuffer&) = delete;

  uint8_t* data() const { return data_; }
  uint64_t size() const { return size_; }
  uint64_t region_id() const { return region_id_; }

  // A reference to `shape` elements of `dtype` at byte `offset`.
  hsap::v1::TensorRef Ref(uint64_t offset, const std::vector<int64_t>& shape,
                          hsap::v1::DType dtype) const;

 private:
  friend class Client;
  SharedBuffer(uint8_t* data, uint64_t size, uint64_t region_id)
      : data_(data), size_(size), region_id_(region_id) {}
  uint8_t* data_;
  uint64_t size_;
  uint64_t region_id_;
};

class Client {
 public:
  // Opens the session, then the gRPC channel. UNAVAILABLE when no daemon
  // listens at `socket_path`; the daemon's code (RESOURCE_EXHAUSTED at its
  // --max_sessions cap) when it refuses the session.
  static absl::StatusOr<std::unique_ptr<Client>> Connect(const std::string& socket_path);
  ~Client();

  // Creates a memfd of `size` bytes (MFD_ALLOW_SEALING: the daemon seals it
  // against shrinking), maps it here, passes it to the daemon and
  // registers it.
  absl::StatusOr<std::unique_ptr<SharedBuffer>> CreateBuffer(uint64_t size,
                                                             const std::string& name);
  absl::Status Unregister(uint64_t region_id);

  // Raw calls with this session's metadata; errors carry the daemon's code
  // and message.
  absl::StatusOr<hsap::v1::RegisterRegionResponse> RegisterRegion(
      const hsap::v1::RegisterRegionRequest& request);
  absl::StatusOr<hsap::v1::ListRegionsResponse> ListRegions();
  absl::StatusOr<hsap::v1::AttentionForwardResponse> Forward(
      const hsap::v1::AttentionForwardRequest& request);
  absl::StatusOr<hsap::v1::AttentionBackwardResponse> Backward(
      const hsap::v1::AttentionBackwardRequest& request);

  // Passes `fd` on the session socket under `transfer_id` (what
  // RegisterRegion's memfd source names). Exposed for tests of bad input.
  absl::Status PassFd(int fd, uint64_t transfer_id);

  uint64_t session_id() const { return session_id_; }
  const std::string& session_token() const { return session_token_; }
  std::shared_ptr<grpc::Channel> channel() const { return channel_; }
  // Adds the session metadata to a context for calls made on channel().
  void Authorize(grpc::ClientContext* context) const;

 private:
  Client() = default;

  UniqueFd session_fd_;
  uint64_t session_id_ = 0;
  std::string session_token_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<hsap::v1::Regions::Stub> regions_;
  std::unique_ptr<hsap::v1::Attention::Stub> attention_;
  absl::Mutex session_mu_;
  uint64_t next_transfer_id_ ABSL_GUARDED_BY(session_mu_) = 1;
};

}  // namespace hsap::client

#endif  // HSAP_CLIENT_CPP_HSAP_CLIENT_H_
