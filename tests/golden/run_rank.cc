#include "tests/golden/run_rank.h"

#include <thread>

#include "absl/time/clock.h"
#include "server/exec/cpu_backend.h"
#include "server/exec/executor.h"
#include "server/transport/inprocess_transport.h"

namespace hsap::golden {

std::string RunGroup(const plan::Plan& plan, const kernels::AttentionShapeForGolden& shape,
                     const std::vector<RankTensors>& tensors, int kernel_threads) {
  const int32_t P = plan.spec.topology.num_ranks();
  auto fabric = transport::InProcessFabric::Create(P, plan.spec.topology.devices_per_node);
  if (!fabric.ok()) return fabric.status().ToString();
  exec::CpuBackend backend(kernel_threads);  // one pool, shared by the ranks
  std::vector<absl::Status> status(P);
  const absl::Time deadline = absl::Now() + absl::Seconds(120);
  std::vector<std::thread> threads;
  for (int32_t r = 0; r < P; ++r) {
    threads.emplace_back([&, r] {
      const RankTensors& t = tensors[r];
      exec::RankBuffers b{t.q, t.k, t.v, t.o, t.lse, t.d_o, t.dq, t.dk, t.dv};
      transport::Transport* e = (*fabric)->endpoint(r);
      status[r] = exec::RunForward(plan, r, shape, b, e, &backend, deadline, 1, nullptr);
      if (status[r].ok()) {
        status[r] = exec::RunBackward(plan, r, shape, b, e, &backend, deadline, 1, nullptr);
      }
    });
  }
  for (auto& th : threads) th.join();
  for (const absl::Status& s : status) {
    if (!s.ok()) return s.ToString();
  }
  return "";
}

}  // namespace hsap::golden
