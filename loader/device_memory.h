// Small RAII owners of device memory, streams and events, over the DriverApi table, so
// that tests, benchmarks and the dispatcher need no cudart.
//
// Each is move-only, frees its handle in the destructor (errors there are ignored: there
// is nobody to tell), and keeps a pointer to the DriverApi, which must outlive it. The
// context that was current at creation must be current when they are used and
// destroyed (the driver's rule); none of them switches contexts.
//
// Thread safety: like the driver handles they wrap: a buffer may be used from several
// threads; one object must not be moved or destroyed while another thread uses it.
#ifndef CUBIST_LOADER_DEVICE_MEMORY_H_
#define CUBIST_LOADER_DEVICE_MEMORY_H_

#include <cuda.h>

#include <cstddef>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "loader/driver_api.h"

namespace cubist {

class DeviceBuffer {
 public:
  // cuMemAlloc of `bytes` (0 gives an empty buffer without a driver call).
  // Errors: ResourceExhausted when the device is out of memory, else CuCheck's mapping.
  [[nodiscard]] static absl::StatusOr<DeviceBuffer> Allocate(DriverApi& driver,
                                                             size_t bytes);
  DeviceBuffer() = default;
  ~DeviceBuffer();
  DeviceBuffer(DeviceBuffer&& other) noexcept;
  DeviceBuffer& operator=(DeviceBuffer&& other) noexcept;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  CUdeviceptr get() const { return ptr_; }
  size_t size() const { return size_; }
  // Address of the pointer, for kernel parameter arrays (void* params[] = {b.arg()}).
  void* arg() { return &ptr_; }

  // Synchronous copies and fill; `bytes` must not exceed size() - offset
  // (InvalidArgument otherwise).
  [[nodiscard]] absl::Status CopyFromHost(const void* src, size_t bytes,
                                          size_t offset = 0);
  [[nodiscard]] absl::Status CopyToHost(void* dst, size_t bytes, size_t offset = 0) const;
  [[nodiscard]] absl::Status Fill(unsigned char value);
  // Asynchronous variants on `stream`.
  [[nodiscard]] absl::Status CopyFromHostAsync(const void* src, size_t bytes,
                                               CUstream stream, size_t offset = 0);
  [[nodiscard]] absl::Status CopyToHostAsync(void* dst, size_t bytes, CUstream stream,
                                             size_t offset = 0) const;
  [[nodiscard]] absl::Status FillAsync(unsigned char value, CUstream stream);

 private:
  void Reset();
  DriverApi* driver_ = nullptr;
  CUdeviceptr ptr_ = 0;
  size_t size_ = 0;
};

class Stream {
 public:
  // cuStreamCreate with `flags` (CU_STREAM_DEFAULT or CU_STREAM_NON_BLOCKING).
  [[nodiscard]] static absl::StatusOr<Stream> Create(
      DriverApi& driver, unsigned int flags = CU_STREAM_NON_BLOCKING);
  Stream() = default;
  ~Stream();
  Stream(Stream&& other) noexcept;
  Stream& operator=(Stream&& other) noexcept;
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;

  CUstream get() const { return stream_; }
  [[nodiscard]] absl::Status Synchronize() const;

 private:
  void Reset();
  DriverApi* driver_ = nullptr;
  CUstream stream_ = nullptr;
};

class Event {
 public:
  // cuEventCreate with `flags` (CU_EVENT_DEFAULT times; CU_EVENT_DISABLE_TIMING not).
  [[nodiscard]] static absl::StatusOr<Event> Create(DriverApi& driver,
                                                    unsigned int flags = CU_EVENT_DEFAULT);
  Event() = default;
  ~Event();
  Event(Event&& other) noexcept;
  Event& operator=(Event&& other) noexcept;
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;

  CUevent get() const { return event_; }
  [[nodiscard]] absl::Status Record(CUstream stream) const;
  [[nodiscard]] absl::Status Synchronize() const;
  // Milliseconds from `start` to `end` (both recorded and complete).
  [[nodiscard]] static absl::StatusOr<float> ElapsedMs(const Event& start,
                                                       const Event& end);

 private:
  void Reset();
  DriverApi* driver_ = nullptr;
  CUevent event_ = nullptr;
};

}  // namespace cubist

#endif  // CUBIST_LOADER_DEVICE_MEMORY_H_
