#include "client/cpp/hsap_client.h"

#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/fd_passing.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/security/credentials.h"

namespace hsap::client {
namespace {

absl::Status FromGrpc(const grpc::Status& s) {
  if (s.ok()) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(s.error_code()), s.error_message());
}

}  // namespace

SharedBuffer::~SharedBuffer() {
  if (data_ != nullptr) munmap(data_, size_);
}

hsap::v1::TensorRef SharedBuffer::Ref(uint64_t offset, const std::vector<int64_t>& shape,
                                      hsap::v1::DType dtype) const {
  hsap::v1::TensorRef ref;
  ref.set_region_id(region_id_);
  ref.set_offset(offset);
  for (int64_t d : shape) ref.add_shape(d);
  ref.set_dtype(dtype);
  return ref;
}

absl::StatusOr<std::unique_ptr<Client>> Client::Connect(const std::string& socket_path) {
  std::unique_ptr<Client> c(new Client());
  const std::string session_path = socket_path + ".session";
  sockaddr_un addr = {};
  addr.sun_family = AF_UNIX;
  if (session_path.size() >= sizeof(addr.sun_path)) {
    return absl::InvalidArgumentError(absl::StrCat("socket path '", socket_path, "' is too long"));
  }
  std::memcpy(addr.sun_path, session_path.c_str(), session_path.size() + 1);
  c->session_fd_.reset(socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0));
  if (connect(c->session_fd_.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    return absl::UnavailableError(
        absl::StrCat("no hsapd session socket at ", session_path, ": ", strerror(errno)));
  }
  char buf[4096];
  const ssize_t n = recv(c->session_fd_.get(), buf, sizeof(buf), 0);
  hsap::v1::SessionHello hello;
  if (n <= 0 || !hello.ParseFromArray(buf, static_cast<int>(n))) {
    return absl::UnavailableError(absl::StrCat("hsapd at ", session_path,
                                               " closed the session without a hello (is this "
                                               "user allowed?)"));
  }
  if (hello.code() != 0) {
    // The daemon refused the session (e.g. RESOURCE_EXHAUSTED at --max_sessions).
    return absl::Status(static_cast<absl::StatusCode>(hello.code()),
                        absl::StrCat("hsapd at ", session_path, " refused the session: ",
                                     hello.message()));
  }
  c->session_id_ = hello.session_id();
  c->session_token_ = hello.session_token();
  c->channel_ = grpc::CreateChannel("unix:" + socket_path, grpc::InsecureChannelCredentials());
  c->regions_ = hsap::v1::Regions::NewStub(c->channel_);
  c->attention_ = hsap::v1::Attention::NewStub(c->channel_);
  return c;
}

Client::~Client() = default;

void Client::Authorize(grpc::ClientContext* context) const {
  context->AddMetadata("hsap-session-id", absl::StrCat(session_id_));
  context->AddMetadata("hsap-session-token", session_token_);
}

absl::Status Client::PassFd(int fd, uint64_t transfer_id) {
  absl::MutexLock lock(&session_mu_);
  hsap::v1::SessionFdTransfer t;
  t.set_transfer_id(transfer_id);
  std::string bytes = t.SerializeAsString();
  if (SendWithFds(session_fd_.get(), bytes, {fd}, MSG_NOSIGNAL) != static_cast<ssize_t>(bytes.size())) {
    return absl::UnavailableError(absl::StrCat("session socket send failed: ", strerror(errno)));
  }
  char buf[4096];
  const ssize_t n = recv(session_fd_.get(), buf, sizeof(buf), 0);
  hsap::v1::SessionFdAck ack;
  if (n <= 0 || !ack.ParseFromArray(buf, static_cast<int>(n))) {
    return absl::UnavailableError("hsapd closed the session");
  }
  return absl::Status(static_cast<absl::StatusCode>(ack.code()), ack.message());
}

absl::StatusOr<std::unique_ptr<SharedBuffer>> Client::CreateBuffer(uint64_t size,
                                                                   const std::string& name) {
  UniqueFd fd(memfd_create(("hsap-" + name).c_str(), MFD_CLOEXEC | MFD_ALLOW_SEALING));
  if (!fd.valid()) return absl::InternalError(absl::StrCat("memfd_create: ", strerror(errno)));
  if (ftruncate(fd.get(), static_cast<off_t>(size)) != 0) {
    return absl::ResourceExhaustedError(absl::StrCat("ftruncate(", size, "): ", strerror(errno)));
  }
  void* p = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd.get(), 0);
  if (p == MAP_FAILED) return absl::InternalError(absl::StrCat("mmap: ", strerror(errno)));
  uint64_t transfer_id;
  {
    absl::MutexLock lock(&session_mu_);
    transfer_id = next_transfer_id_++;
  }
  absl::Status passed = PassFd(fd.get(), transfer_id);
  if (!passed.ok()) {
    munmap(p, size);
    return passed;
  }
  hsap::v1::RegisterRegionRequest req;
  req.set_name(name);
  req.mutable_memfd()->set_transfer_id(transfer_id);
  req.set_size_bytes(size);
  auto resp = RegisterRegion(req);
  if (!resp.ok()) {
    munmap(p, size);
    return resp.status();
  }
  return std::unique_ptr<SharedBuffer>(
      new SharedBuffer(static_cast<uint8_t*>(p), size, resp->region_id()));
}

absl::StatusOr<hsap::v1::RegisterRegionResponse> Client::RegisterRegion(
    const hsap::v1::RegisterRegionRequest& request) {
  grpc::ClientContext ctx;
  Authorize(&ctx);
  hsap::v1::RegisterRegionResponse resp;
  absl::Status st = FromGrpc(regions_->RegisterRegion(&ctx, request, &resp));
  if (!st.ok()) return st;
  return resp;
}

absl::Status Client::Unregister(uint64_t region_id) {
  grpc::ClientContext ctx;
  Authorize(&ctx);
  hsap::v1::UnregisterRegionRequest req;
  req.set_region_id(region_id);
  hsap::v1::UnregisterRegionResponse resp;
  return FromGrpc(regions_->UnregisterRegion(&ctx, req, &resp));
}

absl::StatusOr<hsap::v1::ListRegionsResponse> Client::ListRegions() {
  grpc::ClientContext ctx;
  Authorize(&ctx);
  hsap::v1::ListRegionsResponse resp;
  absl::Status st = FromGrpc(regions_->ListRegions(&ctx, hsap::v1::ListRegionsRequest(), &resp));
  if (!st.ok()) return st;
  return resp;
}

absl::StatusOr<hsap::v1::AttentionForwardResponse> Client::Forward(
    const hsap::v1::AttentionForwardRequest& request) {
  grpc::ClientContext ctx;
  Authorize(&ctx);
  hsap::v1::AttentionForwardResponse resp;
  absl::Status st = FromGrpc(attention_->Forward(&ctx, request, &resp));
  if (!st.ok()) return st;
  return resp;
}

absl::StatusOr<hsap::v1::AttentionBackwardResponse> Client::Backward(
    const hsap::v1::AttentionBackwardRequest& request) {
  grpc::ClientContext ctx;
  Authorize(&ctx);
  hsap::v1::AttentionBackwardResponse resp;
  absl::Status st = FromGrpc(attention_->Backward(&ctx, request, &resp));
  if (!st.ok()) return st;
  return resp;
}

}  // namespace hsap::client
