// Fuzzes region registration (server/grpc/regions_service.cc) and the
// registry behind it (server/shm/).
//
// The RegisterRegion handler needs a gRPC ServerContext carrying a session
// token, so this target runs the same steps on the same functions directly:
// the name and size checks, the source (a pending memfd by transfer id —
// memfds of a few sizes, a pipe and /dev/null stand in for what a client may
// pass — or a POSIX shm name, with one real object the fuzzer can name), then
// RegionRegistry::Register under small limits; and then a fuzzed sequence of
// Pin / release / Unregister / DropSession / Get / List calls across two
// sessions, all checked against a model of the registry's contract
// (region_registry.h): ids never 0 nor reused, another session's region is
// NOT_FOUND, a pinned region cannot be unregistered, limits are
// RESOURCE_EXHAUSTED, total_bytes is the sum of live mappings, and every
// mapped byte is writable while pinned.
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "google/protobuf/stubs/logging.h"
#include "hsap/v1/regions.pb.h"
#include "server/shm/region.h"
#include "server/shm/region_registry.h"
#include "tests/fuzz/fuzz_util.h"

namespace hsap::shm {
namespace {

constexpr char kShmName[] = "/hsap_fuzz_region";
constexpr uint64_t kShmSize = 8192;

// Pending fds by transfer id, as the session socket would hold them.
struct Fds {
  std::map<uint64_t, int> by_transfer;
  Fds() {
    const uint64_t sizes[] = {1, 4096, 65536};
    for (uint64_t i = 0; i < 3; ++i) {
      const int fd = memfd_create("fuzz", MFD_CLOEXEC | MFD_ALLOW_SEALING);
      FUZZ_CHECK(fd >= 0 && ftruncate(fd, static_cast<off_t>(sizes[i])) == 0);
      by_transfer[i + 1] = fd;
    }
    int p[2];
    FUZZ_CHECK(pipe(p) == 0);
    by_transfer[4] = p[0];
    by_transfer[5] = open("/dev/null", O_RDWR | O_CLOEXEC);
    const int shm = shm_open(kShmName, O_RDWR | O_CREAT, 0600);
    FUZZ_CHECK(shm >= 0 && ftruncate(shm, kShmSize) == 0);
    close(shm);
    std::atexit([] { shm_unlink(kShmName); });
  }
};

const Fds& PendingFds() {
  static const Fds* fds = new Fds;
  return *fds;
}

bool ValidName(const std::string& n) {
  if (n.size() < 2 || n.size() > 201 || n[0] != '/' || n == "/." || n == "/..") return false;
  for (size_t i = 1; i < n.size(); ++i) {
    const char c = n[i];
    if (!isalnum(static_cast<unsigned char>(c)) && c != '.' && c != '_' && c != '-') return false;
  }
  return true;
}

// RegisterRegion's steps after authentication (regions_service.cc).
absl::StatusOr<std::unique_ptr<MappedRegion>> MapSource(const v1::RegisterRegionRequest& r) {
  if (r.name().size() > 128) return absl::InvalidArgumentError("name too long");
  if (r.size_bytes() == 0) return absl::InvalidArgumentError("size_bytes is 0");
  switch (r.source_case()) {
    case v1::RegisterRegionRequest::kMemfd: {
      auto it = PendingFds().by_transfer.find(r.memfd().transfer_id());
      if (it == PendingFds().by_transfer.end()) return absl::NotFoundError("no transfer");
      struct stat st;
      FUZZ_CHECK(fstat(it->second, &st) == 0);
      auto m = MappedRegion::FromFd(it->second, r.size_bytes(), RegionKind::kMemfd);
      const bool fits = S_ISREG(st.st_mode) && r.size_bytes() <= static_cast<uint64_t>(st.st_size);
      FUZZ_CHECK(m.ok() == fits);
      if (!m.ok()) FUZZ_CHECK(m.status().code() == absl::StatusCode::kInvalidArgument);
      return m;
    }
    case v1::RegisterRegionRequest::kShm: {
      auto m = MappedRegion::FromShmName(r.shm().name(), r.size_bytes());
      const bool valid = ValidName(r.shm().name());
      FUZZ_CHECK(ValidateShmName(r.shm().name()).ok() == valid);
      if (!valid) {
        FUZZ_CHECK(m.status().code() == absl::StatusCode::kInvalidArgument);
      } else if (r.shm().name() == kShmName) {
        FUZZ_CHECK(m.ok() == (r.size_bytes() <= kShmSize));
      } else {
        FUZZ_CHECK(!m.ok());  // NOT_FOUND, or not ours to open
      }
      return m;
    }
    case v1::RegisterRegionRequest::kCudaIpc:
      return absl::FailedPreconditionError("cuda_ipc regions need a GPU");
    default:
      return absl::InvalidArgumentError("source is not set");
  }
}

// A request that is usually well-formed, so registrations succeed often.
v1::RegisterRegionRequest BuildRequest(FuzzedDataProvider& in) {
  v1::RegisterRegionRequest r;
  r.set_name(in.ConsumeBool() ? "kv" : in.ConsumeRandomLengthString(140));
  const uint64_t sizes[] = {1, 4096, 4097, kShmSize, 65536, 65537, 0, UINT64_MAX};
  r.set_size_bytes(in.ConsumeIntegralInRange<int>(0, 5) == 0 ? in.ConsumeIntegral<uint64_t>()
                                                             : sizes[in.ConsumeIntegralInRange<int>(0, 7)]);
  switch (in.ConsumeIntegralInRange<int>(0, 7)) {
    case 0: r.mutable_shm()->set_name(in.ConsumeRandomLengthString(210)); break;
    case 1: r.mutable_shm()->set_name(kShmName); break;
    case 2: r.mutable_shm()->set_name(in.ConsumeBool() ? "/.." : "/hsap_fuzz_absent"); break;
    case 3: r.mutable_cuda_ipc()->set_device(0); break;
    case 4: break;
    default: r.mutable_memfd()->set_transfer_id(in.ConsumeIntegralInRange<uint64_t>(0, 6)); break;
  }
  return r;
}

struct ModelRegion {
  uint64_t session;
  uint64_t size;
};

void Run(FuzzedDataProvider& in) {
  RegionLimits limits;
  limits.max_regions_per_session = in.ConsumeIntegralInRange<uint64_t>(0, 4);
  limits.max_total_bytes = in.ConsumeBool() ? 80000 : in.ConsumeIntegralInRange<uint64_t>(0, 1 << 17);
  RegionRegistry registry(limits);
  std::map<uint64_t, ModelRegion> model;
  std::map<uint64_t, std::vector<RegionPin>> pins;
  uint64_t max_id = 0;
  auto total = [&] {
    uint64_t t = 0;
    for (const auto& [id, r] : model) t += r.size;
    return t;
  };
  while (in.remaining_bytes() > 0) {
    const uint64_t session = in.ConsumeIntegralInRange<uint64_t>(1, 2);
    switch (in.ConsumeIntegralInRange<int>(0, 5)) {
      case 0: case 1: {  // RegisterRegion with a request from the input
        v1::RegisterRegionRequest r;
        if (in.ConsumeIntegralInRange<int>(0, 7) == 0) {  // raw wire bytes
          if (!r.ParseFromString(in.ConsumeRandomLengthString(64))) break;
        } else {
          r = BuildRequest(in);
        }
        auto mapping = MapSource(r);
        if (!mapping.ok()) break;
        const uint64_t size = (*mapping)->size();
        FUZZ_CHECK(size == r.size_bytes());
        (*mapping)->data()[size - 1] = 1;
        uint64_t regions = 0;
        for (const auto& [id, m] : model) regions += m.session == session;
        const bool fits = regions < limits.max_regions_per_session &&
                          total() + size <= limits.max_total_bytes;
        auto id = registry.Register(session, r.name(), std::move(*mapping));
        FUZZ_CHECK(id.ok() == fits);
        if (!id.ok()) {
          FUZZ_CHECK(id.status().code() == absl::StatusCode::kResourceExhausted);
          break;
        }
        if (std::getenv("HSAP_FUZZ_DEBUG") != nullptr) std::fprintf(stderr, "registered %s\n", r.ShortDebugString().c_str());
        FUZZ_CHECK(*id > max_id);  // never 0, never reused
        max_id = *id;
        model[*id] = {session, size};
        break;
      }
      case 2: {  // Pin (a call binding a tensor)
        const uint64_t id = in.ConsumeIntegralInRange<uint64_t>(0, max_id + 1);
        auto pin = registry.Pin(session, id, "q.region_id");
        auto it = model.find(id);
        const bool visible = it != model.end() && it->second.session == session;
        FUZZ_CHECK(pin.ok() == visible);
        if (!pin.ok()) {
          FUZZ_CHECK(pin.status().code() == absl::StatusCode::kNotFound);
          FUZZ_CHECK(pin.status().message().find("q.region_id") != absl::string_view::npos);
          break;
        }
        FUZZ_CHECK(pin->region()->size() == it->second.size);
        pin->region()->data()[0] = 2;
        pins[id].push_back(std::move(*pin));
        break;
      }
      case 3: {  // a call ends: release pins of one region
        if (pins.empty()) break;
        auto it = pins.begin();
        std::advance(it, in.ConsumeIntegralInRange<size_t>(0, pins.size() - 1));
        for (RegionPin& p : it->second) {
          if (p.region() != nullptr) p.region()->data()[p.region()->size() - 1] = 3;
        }
        pins.erase(it);
        break;
      }
      case 4: {  // UnregisterRegion
        const uint64_t id = in.ConsumeIntegralInRange<uint64_t>(0, max_id + 1);
        const absl::Status st = registry.Unregister(session, id);
        auto it = model.find(id);
        const bool visible = it != model.end() && it->second.session == session;
        const bool pinned = pins.count(id) > 0 && !pins[id].empty();
        if (!visible) {
          FUZZ_CHECK(st.code() == absl::StatusCode::kNotFound);
        } else if (pinned) {
          FUZZ_CHECK(st.code() == absl::StatusCode::kFailedPrecondition);
        } else {
          FUZZ_CHECK(st.ok());
          model.erase(it);
        }
        break;
      }
      default: {  // the client disconnects
        const int removed = registry.DropSession(session);
        int expected = 0;
        for (auto it = model.begin(); it != model.end();) {
          if (it->second.session == session) {
            ++expected;
            it = model.erase(it);
          } else {
            ++it;
          }
        }
        FUZZ_CHECK(removed == expected);
        break;
      }
    }
    // Pins keep their mappings alive even after DropSession.
    for (auto& [id, list] : pins) {
      for (RegionPin& p : list) {
        FUZZ_CHECK(p.region() != nullptr);
        p.region()->data()[p.region()->size() - 1] ^= 1;  // still mapped and writable
      }
    }
    const std::vector<RegionSummary> listed = registry.List();
    FUZZ_CHECK(listed.size() == model.size());
    for (const RegionSummary& s : listed) {
      FUZZ_CHECK(model.count(s.id) && model[s.id].session == s.session && model[s.id].size == s.size_bytes);
      FUZZ_CHECK(s.pins == (pins.count(s.id) ? pins[s.id].size() : 0));
      FUZZ_CHECK(registry.Get(s.session, s.id).ok());
      FUZZ_CHECK(registry.Get(3 - s.session, s.id).status().code() == absl::StatusCode::kNotFound);
    }
    FUZZ_CHECK(registry.total_bytes() == total());
  }
  pins.clear();  // before the registry goes
}

}  // namespace
}  // namespace hsap::shm

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  google::protobuf::SetLogHandler(nullptr);
  hsap::shm::PendingFds();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  FuzzedDataProvider in(data, size);
  hsap::shm::Run(in);
  return 0;
}
