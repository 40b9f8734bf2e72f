#include "server/gpu/device_buffer.h"

#include <cuda_runtime_api.h>

#include <utility>

#include "absl/strings/str_cat.h"
#include "server/gpu/cuda_device.h"
#include "server/gpu/gpu_status.h"

namespace hsap::gpu {

absl::StatusOr<DeviceBuffer> DeviceBuffer::Allocate(int device, int64_t bytes) {
  if (bytes < 0) return absl::InvalidArgumentError(absl::StrCat("DeviceBuffer bytes = ", bytes, " < 0"));
  absl::StatusOr<ScopedDevice> on = ScopedDevice::Enter(device);
  if (!on.ok()) return on.status();
  void* data = nullptr;
  if (bytes > 0) HSAP_CUDA_RETURN_IF_ERROR(cudaMalloc(&data, static_cast<size_t>(bytes)));
  return DeviceBuffer(data, bytes, device);
}

DeviceBuffer::DeviceBuffer(DeviceBuffer&& other) noexcept
    : data_(std::exchange(other.data_, nullptr)),
      bytes_(std::exchange(other.bytes_, 0)),
      device_(std::exchange(other.device_, -1)) {}

DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& other) noexcept {
  if (this != &other) {
    Reset();
    data_ = std::exchange(other.data_, nullptr);
    bytes_ = std::exchange(other.bytes_, 0);
    device_ = std::exchange(other.device_, -1);
  }
  return *this;
}

DeviceBuffer::~DeviceBuffer() { Reset(); }

void DeviceBuffer::Reset() {
  if (data_ != nullptr) {
    absl::StatusOr<ScopedDevice> on = ScopedDevice::Enter(device_);
    cudaFree(data_);  // best effort: a destructor cannot report
  }
  data_ = nullptr;
  bytes_ = 0;
  device_ = -1;
}

absl::Status DeviceBuffer::CheckRange(int64_t bytes, int64_t offset) const {
  // Overflow-safe: offset <= size and bytes <= size - offset.
  if (bytes < 0 || offset < 0 || offset > bytes_ || bytes > bytes_ - offset) {
    return absl::InvalidArgumentError(absl::StrCat("copy of ", bytes, " bytes at offset ", offset,
                                                   " leaves a DeviceBuffer of ", bytes_, " bytes"));
  }
  return absl::OkStatus();
}

absl::Status DeviceBuffer::CopyFromHost(const void* host, int64_t bytes, int64_t offset) {
  absl::Status range = CheckRange(bytes, offset);
  if (!range.ok()) return range;
  if (bytes == 0) return absl::OkStatus();
  absl::StatusOr<ScopedDevice> on = ScopedDevice::Enter(device_);
  if (!on.ok()) return on.status();
  HSAP_CUDA_RETURN_IF_ERROR(cudaMemcpy(static_cast<char*>(data_) + offset, host,
                                       static_cast<size_t>(bytes), cudaMemcpyHostToDevice));
  // From pageable memory cudaMemcpy may return before the DMA into the
  // device landed; work on non-blocking streams (NCCL's) does not order
  // behind the legacy default stream, so wait for it here.
  HSAP_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(cudaStreamLegacy));
  return absl::OkStatus();
}

absl::Status DeviceBuffer::CopyToHost(void* host, int64_t bytes, int64_t offset) const {
  absl::Status range = CheckRange(bytes, offset);
  if (!range.ok()) return range;
  if (bytes == 0) return absl::OkStatus();
  absl::StatusOr<ScopedDevice> on = ScopedDevice::Enter(device_);
  if (!on.ok()) return on.status();
  HSAP_CUDA_RETURN_IF_ERROR(cudaMemcpy(host, static_cast<const char*>(data_) + offset,
                                       static_cast<size_t>(bytes), cudaMemcpyDeviceToHost));
  return absl::OkStatus();
}

absl::Status DeviceBuffer::Fill(unsigned char value) {
  if (bytes_ == 0) return absl::OkStatus();
  absl::StatusOr<ScopedDevice> on = ScopedDevice::Enter(device_);
  if (!on.ok()) return on.status();
  HSAP_CUDA_RETURN_IF_ERROR(cudaMemset(data_, value, static_cast<size_t>(bytes_)));
  // cudaMemset may be asynchronous to the host (see CopyFromHost).
  HSAP_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(cudaStreamLegacy));
  return absl::OkStatus();
}

}  // namespace hsap::gpu
