// A small HTTP/1.1 server for tests, in-process on a loopback address, that serves
// files and misbehaves on request: resets, short bodies, wrong bytes, stalls, error
// statuses with Retry-After, broken Range handling, redirects (to another host and in
// loops) and oversize bodies. Real servers (nginx) run in the integration tests; this
// one exists to produce the faults a real server rarely produces on cue.
//
//   auto server = FaultHttpServer::Start();           // 127.0.0.1, an ephemeral port
//   server->Serve("/a.bin", bytes);
//   server->PushFault("/a.bin", {.kind = FaultKind::kResetAfter, .bytes = 1000});
//   ... fetch server->Url("/a.bin") ...               // 1st request reset, 2nd served
//   EXPECT_EQ(server->Count("/a.bin"), 2);
//
// Each request for a path takes the next queued fault (PushFault) if there is one,
// otherwise the path's standing fault (SetFault), otherwise serves normally: 200, or 206
// for "Range: bytes=N-" / "bytes=N-M", 416 past the end, 404 for unknown paths.
// Connections are kept alive unless a fault closes them.
//
// Thread safety: every method may be called from any thread while the server runs.
// Stop (also run by the destructor) closes every connection, wakes stalled ones and
// joins all threads, so a test never outlives its server's threads.
#ifndef CUBIST_TESTS_TESTLIB_FAULT_HTTP_SERVER_H_
#define CUBIST_TESTS_TESTLIB_FAULT_HTTP_SERVER_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace cubist::testing {

enum class FaultKind {
  kNone,         // serve normally
  kResetAfter,   // headers and `bytes` body bytes, then a TCP reset (RST)
  kShortBody,    // the correct Content-Length, `bytes` body bytes, then a clean close
  kWrongBytes,   // the full length, but every 100th byte flipped from `bytes` on
  kStall,        // headers and `bytes` body bytes, then silence for `stall` (or Stop)
  kStatus,       // answer `status` with a small body; Retry-After when retry_after >= 0
  kIgnoreRange,  // answer a Range request with 200 and the whole file
  kBadRange,     // answer a Range request with 206 from the wrong offset (start + 7),
                 // saying so in Content-Range
  kLyingRange,   // the same bytes, but Content-Range claims the requested offset, and
                 // 7 junk bytes at the end keep the length right (only a hash can tell)
  kLyingShortRange,  // kLyingRange without the padding: 7 bytes short in all
  kRedirect,     // 302 Found to `location` (any URL; loops are made by pointing back)
  kOversize,     // the file followed by junk: `bytes` body bytes in all, with a
                 // Content-Length that says so
  kOversizeNoLength,  // the same, without Content-Length (ends when the server closes)
  kThrottle,     // serve normally, but in chunks of `bytes` bytes 10 ms apart (a slow
                 // link, so that other processes can be killed mid-download)
};

struct Fault {
  FaultKind kind = FaultKind::kNone;
  uint64_t bytes = 0;
  int status = 500;
  int retry_after = -1;  // seconds; -1: no Retry-After header
  std::string location;
  absl::Duration stall = absl::Seconds(60);
};

// What the server saw, in arrival order.
struct RecordedRequest {
  std::string method;
  std::string path;
  std::optional<std::string> range;  // the Range header's value
  std::string host;                  // the Host header's value
  FaultKind fault = FaultKind::kNone;
  uint64_t body_bytes_sent = 0;
};

class FaultHttpServer {
 public:
  // Binds `address` (any 127.x.y.z works on Linux loopback, so two servers can be two
  // hosts) on an ephemeral port and starts accepting.
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<FaultHttpServer>> Start(
      const std::string& address = "127.0.0.1");
  ~FaultHttpServer();
  FaultHttpServer(const FaultHttpServer&) = delete;
  FaultHttpServer& operator=(const FaultHttpServer&) = delete;

  void Serve(const std::string& path, std::string body);
  void PushFault(const std::string& path, Fault fault);
  void SetFault(const std::string& path, Fault fault);  // kNone clears it

  // "http://<address>:<port><path>"; `path` starts with '/'.
  std::string Url(std::string_view path) const;
  const std::string& address() const { return address_; }
  int port() const { return port_; }

  std::vector<RecordedRequest> Requests() const;
  int Count(std::string_view path) const;
  // Connections accepted so far (keep-alive reuse shows as fewer than requests).
  int Connections() const;

  void Stop();

 private:
  struct State;
  FaultHttpServer(std::string address, int port, std::unique_ptr<State> state);
  std::string address_;
  int port_ = 0;
  std::unique_ptr<State> state_;
};

}  // namespace cubist::testing

#endif  // CUBIST_TESTS_TESTLIB_FAULT_HTTP_SERVER_H_
