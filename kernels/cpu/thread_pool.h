// The CPU kernels' thread pool is the common one (common/thread_pool.h).
#ifndef HSAP_KERNELS_CPU_THREAD_POOL_H_
#define HSAP_KERNELS_CPU_THREAD_POOL_H_

#include "common/thread_pool.h"

namespace hsap::kernels::cpu {

using ::hsap::ThreadPool;

}  // namespace hsap::kernels::cpu

#endif  // HSAP_KERNELS_CPU_THREAD_POOL_H_
