#include "loader/device_memory.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"

namespace cubist {
namespace {

absl::Status CheckRange(size_t offset, size_t bytes, size_t size, const char* what) {
  if (offset > size || bytes > size - offset) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, ": ", bytes, " bytes at offset ", offset, " exceed the buffer (", size,
        " bytes)"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<DeviceBuffer> DeviceBuffer::Allocate(DriverApi& driver, size_t bytes) {
  DeviceBuffer b;
  b.driver_ = &driver;
  if (bytes == 0) return b;
  CUBIST_RETURN_IF_ERROR(CuCheck(driver, driver.MemAlloc(&b.ptr_, bytes),
                                 absl::StrCat("cuMemAlloc(", bytes, " bytes)")));
  b.size_ = bytes;
  return b;
}

DeviceBuffer::~DeviceBuffer() { Reset(); }

DeviceBuffer::DeviceBuffer(DeviceBuffer&& other) noexcept
    : driver_(other.driver_),
      ptr_(std::exchange(other.ptr_, 0)),
      size_(std::exchange(other.size_, 0)) {}

DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& other) noexcept {
  if (this != &other) {
    Reset();
    driver_ = other.driver_;
    ptr_ = std::exchange(other.ptr_, 0);
    size_ = std::exchange(other.size_, 0);
  }
  return *this;
}

void DeviceBuffer::Reset() {
  if (ptr_ != 0 && driver_ != nullptr) (void)driver_->MemFree(ptr_);
  ptr_ = 0;
  size_ = 0;
}

absl::Status DeviceBuffer::CopyFromHost(const void* src, size_t bytes, size_t offset) {
  CUBIST_RETURN_IF_ERROR(CheckRange(offset, bytes, size_, "copy to device"));
  if (bytes == 0) return absl::OkStatus();
  return CuCheck(*driver_, driver_->MemcpyHtoD(ptr_ + offset, src, bytes), "cuMemcpyHtoD");
}

absl::Status DeviceBuffer::CopyToHost(void* dst, size_t bytes, size_t offset) const {
  CUBIST_RETURN_IF_ERROR(CheckRange(offset, bytes, size_, "copy from device"));
  if (bytes == 0) return absl::OkStatus();
  return CuCheck(*driver_, driver_->MemcpyDtoH(dst, ptr_ + offset, bytes), "cuMemcpyDtoH");
}

absl::Status DeviceBuffer::Fill(unsigned char value) {
  if (size_ == 0) return absl::OkStatus();
  return CuCheck(*driver_, driver_->MemsetD8(ptr_, value, size_), "cuMemsetD8");
}

absl::Status DeviceBuffer::CopyFromHostAsync(const void* src, size_t bytes, CUstream stream,
                                             size_t offset) {
  CUBIST_RETURN_IF_ERROR(CheckRange(offset, bytes, size_, "copy to device"));
  if (bytes == 0) return absl::OkStatus();
  return CuCheck(*driver_, driver_->MemcpyHtoDAsync(ptr_ + offset, src, bytes, stream),
                 "cuMemcpyHtoDAsync");
}

absl::Status DeviceBuffer::CopyToHostAsync(void* dst, size_t bytes, CUstream stream,
                                           size_t offset) const {
  CUBIST_RETURN_IF_ERROR(CheckRange(offset, bytes, size_, "copy from device"));
  if (bytes == 0) return absl::OkStatus();
  return CuCheck(*driver_, driver_->MemcpyDtoHAsync(dst, ptr_ + offset, bytes, stream),
                 "cuMemcpyDtoHAsync");
}

absl::Status DeviceBuffer::FillAsync(unsigned char value, CUstream stream) {
  if (size_ == 0) return absl::OkStatus();
  return CuCheck(*driver_, driver_->MemsetD8Async(ptr_, value, size_, stream),
                 "cuMemsetD8Async");
}

absl::StatusOr<Stream> Stream::Create(DriverApi& driver, unsigned int flags) {
  Stream s;
  s.driver_ = &driver;
  CUBIST_RETURN_IF_ERROR(CuCheck(driver, driver.StreamCreate(&s.stream_, flags),
                                 "cuStreamCreate"));
  return s;
}

Stream::~Stream() { Reset(); }

Stream::Stream(Stream&& other) noexcept
    : driver_(other.driver_), stream_(std::exchange(other.stream_, nullptr)) {}

Stream& Stream::operator=(Stream&& other) noexcept {
  if (this != &other) {
    Reset();
    driver_ = other.driver_;
    stream_ = std::exchange(other.stream_, nullptr);
  }
  return *this;
}

void Stream::Reset() {
  if (stream_ != nullptr && driver_ != nullptr) (void)driver_->StreamDestroy(stream_);
  stream_ = nullptr;
}

absl::Status Stream::Synchronize() const {
  if (driver_ == nullptr) return absl::FailedPreconditionError("stream: not created");
  return CuCheck(*driver_, driver_->StreamSynchronize(stream_), "cuStreamSynchronize");
}

absl::StatusOr<Event> Event::Create(DriverApi& driver, unsigned int flags) {
  Event e;
  e.driver_ = &driver;
  CUBIST_RETURN_IF_ERROR(CuCheck(driver, driver.EventCreate(&e.event_, flags),
                                 "cuEventCreate"));
  return e;
}

Event::~Event() { Reset(); }

Event::Event(Event&& other) noexcept
    : driver_(other.driver_), event_(std::exchange(other.event_, nullptr)) {}

Event& Event::operator=(Event&& other) noexcept {
  if (this != &other) {
    Reset();
    driver_ = other.driver_;
    event_ = std::exchange(other.event_, nullptr);
  }
  return *this;
}

void Event::Reset() {
  if (event_ != nullptr && driver_ != nullptr) (void)driver_->EventDestroy(event_);
  event_ = nullptr;
}

absl::Status Event::Record(CUstream stream) const {
  if (driver_ == nullptr) return absl::FailedPreconditionError("event: not created");
  return CuCheck(*driver_, driver_->EventRecord(event_, stream), "cuEventRecord");
}

absl::Status Event::Synchronize() const {
  if (driver_ == nullptr) return absl::FailedPreconditionError("event: not created");
  return CuCheck(*driver_, driver_->EventSynchronize(event_), "cuEventSynchronize");
}

absl::StatusOr<float> Event::ElapsedMs(const Event& start, const Event& end) {
  if (start.driver_ == nullptr || end.driver_ == nullptr) {
    return absl::FailedPreconditionError("event: not created");
  }
  float ms = 0;
  CUBIST_RETURN_IF_ERROR(CuCheck(*start.driver_,
                                 start.driver_->EventElapsedTime(&ms, start.event_, end.event_),
                                 "cuEventElapsedTime"));
  return ms;
}

}  // namespace cubist
