#include "client/demo/demo_run.h"

#include <cstdio>
#include <cstring>
#include <random>

#include "absl/strings/str_cat.h"
#include "common/workload.h"

namespace hsap::demo {
namespace {

constexpr char kMagic[8] = {'H', 'S', 'A', 'P', 'D', 'E', 'M', '1'};

// A FILE* that closes itself.
struct File {
  FILE* f = nullptr;
  explicit File(FILE* file) : f(file) {}
  ~File() {
    if (f != nullptr) std::fclose(f);
  }
  File(const File&) = delete;
  File& operator=(const File&) = delete;
};

bool Put(FILE* f, const void* p, size_t n) { return std::fwrite(p, 1, n, f) == n; }
bool Get(FILE* f, void* p, size_t n) { return std::fread(p, 1, n, f) == n; }

template <typename T>
bool PutVector(FILE* f, const std::vector<T>& v) {
  const uint64_t n = v.size();
  return Put(f, &n, sizeof(n)) && Put(f, v.data(), n * sizeof(T));
}

template <typename T>
bool GetVector(FILE* f, std::vector<T>* v, uint64_t max_elements) {
  uint64_t n = 0;
  if (!Get(f, &n, sizeof(n)) || n > max_elements) return false;
  v->resize(n);
  return Get(f, v->data(), n * sizeof(T));
}

bool PutMessage(FILE* f, const google::protobuf::Message& m) {
  const std::string bytes = m.SerializeAsString();
  const uint64_t n = bytes.size();
  return Put(f, &n, sizeof(n)) && Put(f, bytes.data(), n);
}

bool GetMessage(FILE* f, google::protobuf::Message* m) {
  uint64_t n = 0;
  if (!Get(f, &n, sizeof(n)) || n > (1 << 20)) return false;
  std::string bytes(n, '\0');
  return Get(f, bytes.data(), n) && m->ParseFromString(bytes);
}

}  // namespace

const std::vector<StrategyChoice>& DemoStrategies() {
  static const auto* strategies = new std::vector<StrategyChoice>{
      {"ring", hsap::v1::STRATEGY_RING}, {"ulysses", hsap::v1::STRATEGY_ULYSSES},
      {"usp", hsap::v1::STRATEGY_USP},   {"sap", hsap::v1::STRATEGY_SAP},
      {"hsap", hsap::v1::STRATEGY_HSAP}, {"auto", hsap::v1::STRATEGY_AUTO}};
  return *strategies;
}

DemoProblem MakeProblem(const DemoRun& run, std::vector<int64_t> cu_seqlens, int pack) {
  DemoProblem p;
  p.cu_seqlens = std::move(cu_seqlens);
  const int64_t t = p.cu_seqlens.back();
  std::mt19937_64 rng(run.seed * 1000003 + pack);
  std::uniform_real_distribution<float> uni(-1.f, 1.f);
  p.q.resize(t * run.heads_q * run.head_dim);
  p.d_o.resize(p.q.size());
  p.k.resize(t * run.heads_kv * run.head_dim);
  p.v.resize(p.k.size());
  for (auto* x : {&p.q, &p.k, &p.v, &p.d_o}) {
    for (float& e : *x) e = uni(rng);
  }
  return p;
}

absl::StatusOr<std::vector<std::vector<int64_t>>> MakePacks(const DemoRun& run) {
  auto lengths = LoadDocumentLengths(run.workload);
  if (!lengths.ok()) return lengths.status();
  return PackDocuments(*lengths, run.tokens, run.packs, run.seed);
}

std::string ResultPath(const DemoRun& run, int pack, const std::string& strategy, int rank) {
  return absl::StrCat(run.results_dir, "/p", pack, "-", strategy, "-r", rank, ".bin");
}

absl::Status WriteRankResult(const std::string& path, const RankResult& r) {
  const std::string tmp = path + ".tmp";
  {
    File file(std::fopen(tmp.c_str(), "wb"));
    if (file.f == nullptr) return absl::UnavailableError(absl::StrCat("cannot write ", tmp));
    const int64_t dims[3] = {r.heads_q, r.heads_kv, r.head_dim};
    const bool ok = Put(file.f, kMagic, sizeof(kMagic)) && Put(file.f, dims, sizeof(dims)) &&
                    PutVector(file.f, r.tokens) && PutVector(file.f, r.o) &&
                    PutVector(file.f, r.lse) && PutVector(file.f, r.dq) &&
                    PutVector(file.f, r.dk) && PutVector(file.f, r.dv) &&
                    PutMessage(file.f, r.forward) && PutMessage(file.f, r.backward);
    if (!ok || std::fflush(file.f) != 0) {
      return absl::UnavailableError(absl::StrCat("short write to ", tmp));
    }
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    return absl::UnavailableError(absl::StrCat("cannot rename ", tmp, " to ", path));
  }
  return absl::OkStatus();
}

absl::StatusOr<RankResult> ReadRankResult(const std::string& path) {
  File file(std::fopen(path.c_str(), "rb"));
  if (file.f == nullptr) return absl::NotFoundError(absl::StrCat("no result file ", path));
  RankResult r;
  char magic[sizeof(kMagic)];
  int64_t dims[3];
  constexpr uint64_t kMax = uint64_t{1} << 32;
  const bool ok = Get(file.f, magic, sizeof(magic)) &&
                  std::memcmp(magic, kMagic, sizeof(kMagic)) == 0 &&
                  Get(file.f, dims, sizeof(dims)) && GetVector(file.f, &r.tokens, kMax) &&
                  GetVector(file.f, &r.o, kMax) && GetVector(file.f, &r.lse, kMax) &&
                  GetVector(file.f, &r.dq, kMax) && GetVector(file.f, &r.dk, kMax) &&
                  GetVector(file.f, &r.dv, kMax) && GetMessage(file.f, &r.forward) &&
                  GetMessage(file.f, &r.backward);
  if (!ok) return absl::DataLossError(absl::StrCat("result file ", path, " is malformed"));
  r.heads_q = dims[0];
  r.heads_kv = dims[1];
  r.head_dim = dims[2];
  const int64_t n = static_cast<int64_t>(r.tokens.size());
  if (static_cast<int64_t>(r.o.size()) != n * r.heads_q * r.head_dim ||
      static_cast<int64_t>(r.lse.size()) != n * r.heads_q || r.dq.size() != r.o.size() ||
      static_cast<int64_t>(r.dk.size()) != n * r.heads_kv * r.head_dim ||
      r.dv.size() != r.dk.size()) {
    return absl::DataLossError(absl::StrCat("result file ", path, " has inconsistent sizes"));
  }
  return r;
}

}  // namespace hsap::demo
