// DeviceBuffer: a move-only owner of device memory (cudaMalloc / cudaFree)
// on one GPU, with synchronous host copies for setup and tests.
//
//   HSAP_ASSIGN_OR_RETURN(DeviceBuffer kv, DeviceBuffer::Allocate(device, bytes));
//   HSAP_RETURN_IF_ERROR(kv.CopyFromHost(host.data(), host.size()));
//
// A zero-byte buffer is valid and owns no memory (data() == nullptr).
#ifndef HSAP_SERVER_GPU_DEVICE_BUFFER_H_
#define HSAP_SERVER_GPU_DEVICE_BUFFER_H_

#include <cstdint>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace hsap::gpu {

class DeviceBuffer {
 public:
  // `bytes` of uninitialized device memory on `device`. INVALID_ARGUMENT for
  // negative bytes or a device out of range; FAILED_PRECONDITION without a
  // GPU; RESOURCE_EXHAUSTED when the device is out of memory.
  static absl::StatusOr<DeviceBuffer> Allocate(int device, int64_t bytes);

  DeviceBuffer() = default;  // empty
  DeviceBuffer(DeviceBuffer&& other) noexcept;
  DeviceBuffer& operator=(DeviceBuffer&& other) noexcept;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  // cudaFree (which waits for work using the memory: CUDA's rule).
  ~DeviceBuffer();

  void* data() const { return data_; }
  int64_t size() const { return bytes_; }
  int device() const { return device_; }

  // Synchronous copies of `bytes` from/to host memory at `offset`.
  // INVALID_ARGUMENT when [offset, offset + bytes) leaves the buffer.
  absl::Status CopyFromHost(const void* host, int64_t bytes, int64_t offset = 0);
  absl::Status CopyToHost(void* host, int64_t bytes, int64_t offset = 0) const;
  // Synchronous memset of the whole buffer.
  absl::Status Fill(unsigned char value);

 private:
  DeviceBuffer(void* data, int64_t bytes, int device) : data_(data), bytes_(bytes), device_(device) {}
  absl::Status CheckRange(int64_t bytes, int64_t offset) const;
  void Reset();
  void* data_ = nullptr;
  int64_t bytes_ = 0;
  int device_ = -1;
};

}  // namespace hsap::gpu

#endif  // HSAP_SERVER_GPU_DEVICE_BUFFER_H_
