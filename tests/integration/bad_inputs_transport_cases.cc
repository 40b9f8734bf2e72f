// The bad-input cases on regions, the session socket, raw bytes on the Unix
// gRPC socket and the TCP port (bad_inputs_test.cc runs them).
#include "tests/integration/bad_inputs_env.h"

namespace hsap::bad_inputs {

std::vector<Case> TransportCases() {
  std::vector<Case> c;
  // --- Regions.
  c.push_back({"register_unknown_transfer", [](Env& e) {
                 hsap::v1::RegisterRegionRequest r;
                 r.set_size_bytes(64);
                 r.mutable_memfd()->set_transfer_id(777);
                 return Register(e, r);
               }, Code::kNotFound, "memfd.transfer_id 777"});
  c.push_back({"register_transfer_of_other_session", [](Env& e) {
                 UniqueFd fd = NewMemfd("other-transfer", 4096);
                 absl::Status st = e.other->PassFd(fd.get(), 31337);
                 if (!st.ok()) return st;
                 hsap::v1::RegisterRegionRequest r;
                 r.set_size_bytes(4096);
                 r.mutable_memfd()->set_transfer_id(31337);
                 return Register(e, r);
               }, Code::kNotFound, "memfd.transfer_id 31337"});
  c.push_back({"register_size_zero", [](Env& e) {
                 hsap::v1::RegisterRegionRequest r;
                 r.mutable_shm()->set_name("/x");
                 return Register(e, r);
               }, Code::kInvalidArgument, "size_bytes is 0"});
  c.push_back({"register_memfd_smaller_than_size", [](Env& e) {
                 UniqueFd fd = NewMemfd("small", 100);
                 absl::Status st = e.client->PassFd(fd.get(), 5);
                 if (!st.ok()) return st;
                 hsap::v1::RegisterRegionRequest r;
                 r.mutable_memfd()->set_transfer_id(5);
                 r.set_size_bytes(4096);
                 return Register(e, r);
               }, Code::kInvalidArgument, "size_bytes is 4096"});
  c.push_back({"register_absurd_size", [](Env& e) {
                 UniqueFd fd = NewMemfd("absurd", 4096);
                 absl::Status st = e.client->PassFd(fd.get(), 6);
                 if (!st.ok()) return st;
                 hsap::v1::RegisterRegionRequest r;
                 r.mutable_memfd()->set_transfer_id(6);
                 r.set_size_bytes(uint64_t{1} << 63);
                 return Register(e, r);
               }, Code::kInvalidArgument, "size_bytes is 9223372036854775808"});
  c.push_back({"register_pipe_not_memfd", [](Env& e) {
                 int p[2];
                 if (pipe2(p, O_CLOEXEC) != 0) return absl::InternalError("pipe");
                 UniqueFd r0(p[0]), r1(p[1]);
                 absl::Status st = e.client->PassFd(p[0], 7);
                 if (!st.ok()) return st;
                 hsap::v1::RegisterRegionRequest r;
                 r.mutable_memfd()->set_transfer_id(7);
                 r.set_size_bytes(64);
                 return Register(e, r);
               }, Code::kInvalidArgument, "not a memfd or shared-memory object"});
  // --- Region fds of every other kind (issue 14): refused when passed,
  // naming the kind; unsealable memfds refused at registration, saying how.
  auto pass_and_register = [](Env& e, int fd, uint64_t transfer, uint64_t size) {
    absl::Status st = e.client->PassFd(fd, transfer);
    if (!st.ok()) return st;
    hsap::v1::RegisterRegionRequest r;
    r.mutable_memfd()->set_transfer_id(transfer);
    r.set_size_bytes(size);
    return Register(e, r);
  };
  c.push_back({"register_memfd_without_allow_sealing", [=](Env& e) {
                 UniqueFd fd(memfd_create("unsealable", MFD_CLOEXEC));
                 if (ftruncate(fd.get(), 4096) != 0) return absl::InternalError("ftruncate");
                 return pass_and_register(e, fd.get(), 40, 4096);
               }, Code::kFailedPrecondition, "created without MFD_ALLOW_SEALING"});
  c.push_back({"register_memfd_sealed_against_writing", [=](Env& e) {
                 UniqueFd fd = NewMemfd("write-sealed", 4096);
                 if (fcntl(fd.get(), F_ADD_SEALS, F_SEAL_WRITE) != 0) return absl::InternalError("seal");
                 return pass_and_register(e, fd.get(), 41, 4096);
               }, Code::kFailedPrecondition, "sealed against writing"});
  c.push_back({"register_disk_file_read_write", [=](Env& e) {
                 // The test's working directory (Bazel's runfiles) is on disk.
                 const std::string path = absl::StrCat("hsap-bad-disk-", getpid());
                 UniqueFd fd(open(path.c_str(), O_CREAT | O_RDWR | O_CLOEXEC, 0600));
                 unlink(path.c_str());
                 if (!fd.valid() || ftruncate(fd.get(), 4096) != 0) return absl::InternalError("disk file");
                 return pass_and_register(e, fd.get(), 42, 4096);
               }, Code::kInvalidArgument, "a regular file on a disk file system"});
  auto dev_shm_file = [](const char* tag) {
    const std::string path = absl::StrCat("/dev/shm/hsap-bad-", tag, "-", getpid());
    UniqueFd rw(open(path.c_str(), O_CREAT | O_RDWR | O_CLOEXEC, 0600));
    if (rw.valid()) (void)!ftruncate(rw.get(), 4096);
    return path;
  };
  c.push_back({"register_read_only_shm_file", [=](Env& e) {
                 const std::string path = dev_shm_file("ro");
                 UniqueFd fd(open(path.c_str(), O_RDONLY | O_CLOEXEC));
                 unlink(path.c_str());
                 return pass_and_register(e, fd.get(), 43, 4096);
               }, Code::kInvalidArgument, "opened read-only"});
  c.push_back({"register_o_path_fd", [=](Env& e) {
                 const std::string path = dev_shm_file("opath");
                 UniqueFd fd(open(path.c_str(), O_PATH | O_CLOEXEC));
                 unlink(path.c_str());
                 return pass_and_register(e, fd.get(), 44, 4096);
               }, Code::kInvalidArgument, "an O_PATH descriptor"});
  c.push_back({"register_socket_fd", [=](Env& e) {
                 int sv[2];
                 if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0) return absl::InternalError("socketpair");
                 UniqueFd a(sv[0]), b(sv[1]);
                 return pass_and_register(e, a.get(), 45, 64);
               }, Code::kInvalidArgument, "a socket"});
  c.push_back({"session_passes_its_own_socket", [](Env& e) {
                 // A socket kept by the daemon would keep this session alive
                 // after the client exits: refused and closed at once.
                 RawSession s;
                 absl::Status st = s.Open(e.daemon->socket());
                 if (!st.ok()) return st;
                 const int self = s.fd();
                 s.Send(TransferMessage(46), {self});
                 return s.Outcome(e.daemon->socket());
               }, Code::kInvalidArgument, "is a socket"});
  c.push_back({"register_shm_name_of_a_fifo", [](Env& e) {
                 const std::string name = absl::StrCat("hsap-bad-fifo-", getpid());
                 const std::string path = "/dev/shm/" + name;
                 unlink(path.c_str());
                 if (mkfifo(path.c_str(), 0600) != 0) return absl::InternalError("mkfifo");
                 hsap::v1::RegisterRegionRequest r;
                 r.set_size_bytes(64);
                 r.mutable_shm()->set_name("/" + name);
                 absl::Status st = Register(e, r);
                 unlink(path.c_str());
                 return st;
               }, Code::kInvalidArgument, "a pipe (FIFO)"});
  c.push_back({"register_shm_path_traversal", [](Env& e) {
                 hsap::v1::RegisterRegionRequest r;
                 r.set_size_bytes(64);
                 r.mutable_shm()->set_name("/../etc/passwd");
                 return Register(e, r);
               }, Code::kInvalidArgument, "shm.name"});
  c.push_back({"register_shm_missing", [](Env& e) {
                 hsap::v1::RegisterRegionRequest r;
                 r.set_size_bytes(64);
                 r.mutable_shm()->set_name("/hsap-bad-inputs-no-such-object");
                 return Register(e, r);
               }, Code::kNotFound, "does not exist"});
  c.push_back({"register_no_source", [](Env& e) {
                 hsap::v1::RegisterRegionRequest r;
                 r.set_size_bytes(64);
                 return Register(e, r);
               }, Code::kInvalidArgument, "source is not set"});
  c.push_back({"register_cuda_ipc_on_cpu", [](Env& e) {
                 hsap::v1::RegisterRegionRequest r;
                 r.set_size_bytes(64);
                 r.mutable_cuda_ipc()->set_handle(std::string(64, 'h'));
                 return Register(e, r);
               }, Code::kFailedPrecondition, ""});
  c.push_back({"unregister_unknown", [](Env& e) { return e.client->Unregister(987654); },
               Code::kNotFound, "region_id 987654"});
  c.push_back({"unregister_other_sessions_region", [](Env& e) {
                 return e.client->Unregister(e.other_buf->buffer().region_id()); },
               Code::kNotFound, "is not registered by this session"});
  c.push_back({"unregister_twice", [](Env& e) {
                 auto b = e.client->CreateBuffer(4096, "twice");
                 if (!b.ok()) return b.status();
                 absl::Status st = e.client->Unregister((*b)->region_id());
                 if (!st.ok()) return st;
                 return e.client->Unregister((*b)->region_id());
               }, Code::kNotFound, "is not registered by this session"});
  // --- The session socket.
  auto session_case = [](std::function<absl::Status(RawSession&)> send) {
    return [send](Env& e) {
      RawSession s;
      absl::Status st = s.Open(e.daemon->socket());
      if (!st.ok()) return st;
      st = send(s);
      if (!st.ok()) return st;
      return s.Outcome(e.daemon->socket());
    };
  };
  auto sent = [](bool ok) { return ok ? absl::OkStatus() : absl::InternalError("sendmsg failed"); };
  c.push_back({"session_transfer_without_fd", session_case([=](RawSession& s) {
                 return sent(s.Send(TransferMessage(1), {})); }),
               Code::kInvalidArgument, "carries 0 file descriptors; it needs exactly 1"});
  c.push_back({"session_transfer_with_two_fds", session_case([=](RawSession& s) {
                 UniqueFd a = NewMemfd("two-a", 4096), b = NewMemfd("two-b", 4096);
                 return sent(s.Send(TransferMessage(2), {a.get(), b.get()})); }),
               Code::kInvalidArgument, "carries 2 file descriptors"});
  c.push_back({"session_transfer_with_eight_fds", session_case([=](RawSession& s) {
                 std::vector<UniqueFd> fds;
                 std::vector<int> raw;
                 for (int i = 0; i < 8; ++i) {
                   fds.push_back(NewMemfd("eight", 4096));
                   raw.push_back(fds.back().get());
                 }
                 return sent(s.Send(TransferMessage(3), raw)); }),
               Code::kUnauthenticated, "session closed by the daemon"});
  c.push_back({"session_wrong_type_hello_echoed", session_case([=](RawSession& s) {
                 return sent(s.Send(s.hello().SerializeAsString(), {})); }),
               Code::kInvalidArgument, "carries 0 file descriptors"});
  c.push_back({"session_wrong_type_register_request", session_case([=](RawSession& s) {
                 hsap::v1::RegisterRegionRequest r;
                 r.set_name("not-a-transfer");
                 r.set_size_bytes(64);
                 UniqueFd fd = NewMemfd("wrongtype", 4096);
                 return sent(s.Send(r.SerializeAsString(), {fd.get()})); }),
               Code::kInvalidArgument, "SessionFdTransfer.transfer_id is 0 (unset)"});
  // transfer_id 0 serializes to 0 bytes: an empty message, read as a hang-up.
  c.push_back({"session_empty_message_with_fd", session_case([=](RawSession& s) {
                 UniqueFd fd = NewMemfd("zero", 4096);
                 return sent(s.Send(TransferMessage(0), {fd.get()})); }),
               Code::kUnauthenticated, "session closed by the daemon"});
  c.push_back({"session_random_garbage", session_case([=](RawSession& s) {
                 return sent(s.Send(RandomBytes(200, 1), {})); }),
               Code::kUnauthenticated, "session closed by the daemon"});
  c.push_back({"session_truncated_varint", session_case([=](RawSession& s) {
                 return sent(s.Send(std::string("\x08\xff\xff", 3), {})); }),
               Code::kUnauthenticated, "session closed by the daemon"});
  c.push_back({"session_oversized_64KiB", session_case([=](RawSession& s) {
                 return sent(s.Send(std::string(64 << 10, '\x08'), {})); }),
               Code::kUnauthenticated, "session closed by the daemon"});
  c.push_back({"session_empty_message", session_case([=](RawSession& s) {
                 return sent(s.Send(std::string(), {})); }),
               Code::kUnauthenticated, "session closed by the daemon"});
  c.push_back({"session_duplicate_transfer_id", [](Env& e) {
                 RawSession s;
                 absl::Status st = s.Open(e.daemon->socket());
                 if (!st.ok()) return st;
                 UniqueFd a = NewMemfd("dup-a", 4096), b = NewMemfd("dup-b", 4096);
                 s.Send(TransferMessage(9), {a.get()});
                 st = s.Outcome(e.daemon->socket());
                 if (!st.ok()) return absl::InternalError(absl::StrCat("first transfer: ", st.ToString()));
                 s.Send(TransferMessage(9), {b.get()});
                 return s.Outcome(e.daemon->socket());
               }, Code::kAlreadyExists, "transfer_id 9 already holds an fd in this session"});
  c.push_back({"session_65_pending_fds", [](Env& e) {
                 RawSession s;
                 absl::Status st = s.Open(e.daemon->socket());
                 if (!st.ok()) return st;
                 UniqueFd fd = NewMemfd("pending", 4096);
                 for (int i = 1; i <= 64; ++i) {
                   s.Send(TransferMessage(100 + i), {fd.get()});
                   st = s.Outcome(e.daemon->socket());
                   if (!st.ok()) return absl::InternalError(absl::StrCat("transfer ", i, ": ", st.ToString()));
                 }
                 s.Send(TransferMessage(165), {fd.get()});
                 return s.Outcome(e.daemon->socket());
               }, Code::kResourceExhausted, "fds waiting for RegisterRegion, the limit"});
  // --- Raw bytes and raw gRPC on the Unix socket.
  c.push_back({"unix_grpc_random_bytes", [](Env& e) {
                 return GarbageOnUnix(e.daemon->socket(), RandomBytes(4096, 2)); },
               Code::kUnavailable, "closed the connection"});
  c.push_back({"unix_grpc_http1_request", [](Env& e) {
                 return GarbageOnUnix(e.daemon->socket(), "GET / HTTP/1.1\r\nHost: x\r\n\r\n"); },
               Code::kUnavailable, "closed the connection"});
  c.push_back({"unix_grpc_h2_frame_of_16MiB", [](Env& e) {
                 return GarbageOnUnix(e.daemon->socket(), PrefaceThenFrame(0x0, 1, 0xffffff, RandomBytes(300, 3))); },
               Code::kUnavailable, "closed the connection"});
  c.push_back({"unix_grpc_undecodable_request", [](Env& e) {
                 return RawCall(e.client->channel(), "/hsap.v1.Attention/Forward",
                                std::string("\x0a\xff\xff\xff\xff\x0f", 6), e.client.get()); },
               Code::kInternal, ""});
  c.push_back({"unix_grpc_unknown_method", [](Env& e) {
                 return RawCall(e.client->channel(), "/hsap.v1.Attention/Sideways", "", e.client.get()); },
               Code::kUnimplemented, ""});
  c.push_back({"unix_grpc_request_65MiB", EditForward([](Env&, Fwd& r) {
                 r.mutable_call()->set_group(std::string(65 << 20, 'x')); }),
               Code::kResourceExhausted, "larger than max"});
  // --- The TCP port.
  c.push_back({"tcp_random_bytes", [](Env& e) { return GarbageOnTcp(e.port, RandomBytes(4096, 4)); },
               Code::kUnavailable, "closed the connection"});
  c.push_back({"tcp_http1_request", [](Env& e) {
                 return GarbageOnTcp(e.port, "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n"); },
               Code::kUnavailable, "closed the connection"});
  c.push_back({"tcp_h2_settings_of_5_bytes", [](Env& e) {
                 return GarbageOnTcp(e.port, PrefaceThenFrame(0x4, 0, 5, "xxxxx")); },
               Code::kUnavailable, "closed the connection"});
  c.push_back({"tcp_forward_without_session", [](Env& e) {
                 auto stub = hsap::v1::Attention::NewStub(TcpChannel(e.port));
                 grpc::ClientContext ctx;
                 ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
                 hsap::v1::AttentionForwardResponse resp;
                 return FromGrpc(stub->Forward(&ctx, e.Good(), &resp));
               }, Code::kUnauthenticated, "carries no hsap-session-id"});
  c.push_back({"tcp_undecodable_request", [](Env& e) {
                 return RawCall(TcpChannel(e.port), "/hsap.v1.Regions/RegisterRegion",
                                std::string("\x2a\x10garbage", 9)); },
               Code::kInternal, ""});
  c.push_back({"tcp_plans_dispatch_zero_nodes", [](Env& e) {
                 auto stub = hsap::v1::Plans::NewStub(TcpChannel(e.port));
                 grpc::ClientContext ctx;
                 ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
                 hsap::v1::DispatchRequest req;
                 req.mutable_spec()->add_cu_seqlens(0);
                 req.mutable_spec()->add_cu_seqlens(16);
                 req.mutable_spec()->set_total_tokens(16);
                 req.mutable_spec()->mutable_shape()->set_dtype(hsap::v1::DTYPE_BFLOAT16);
                 hsap::v1::DispatchResponse resp;
                 return FromGrpc(stub->Dispatch(&ctx, req, &resp));
               }, Code::kInvalidArgument, "topology"});
  return c;
}

}  // namespace hsap::bad_inputs
