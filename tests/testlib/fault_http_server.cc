#include "tests/testlib/fault_http_server.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <set>
#include <thread>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "base/strings.h"

namespace cubist::testing {

struct FaultHttpServer::State {
  std::mutex mu;
  std::condition_variable cv;  // wakes stalled connections at Stop
  bool stopping = false;
  std::map<std::string, std::string> files;
  std::map<std::string, std::deque<Fault>> queued;
  std::map<std::string, Fault> standing;
  std::vector<RecordedRequest> requests;
  int connections = 0;
  std::set<int> open_fds;  // connection sockets not yet closed; Stop shuts them down
  int listen_fd = -1;
  int wake_pipe[2] = {-1, -1};
  std::thread acceptor;
  std::vector<std::thread> workers;

  void AcceptLoop();
  void ServeConnection(int fd);
  // Returns false when the connection must end.
  bool HandleRequest(int fd, const std::string& head);
  void CloseConnection(int fd, bool reset);
  void SetSent(size_t index, uint64_t n) {
    std::lock_guard<std::mutex> l(mu);
    requests[index].body_bytes_sent += n;
  }
};

namespace {

bool SendAll(int fd, std::string_view data) {
  size_t off = 0;
  while (off < data.size()) {
    ssize_t n = ::send(fd, data.data() + off, data.size() - off, MSG_NOSIGNAL);
    if (n < 0) {
      if (errno == EINTR) continue;
      return false;  // the client went away (curl aborts oversize bodies): fine
    }
    off += static_cast<size_t>(n);
  }
  return true;
}

const char* Reason(int status) {
  switch (status) {
    case 200: return "OK";
    case 206: return "Partial Content";
    case 302: return "Found";
    case 404: return "Not Found";
    case 416: return "Range Not Satisfiable";
    case 429: return "Too Many Requests";
    case 500: return "Internal Server Error";
    case 503: return "Service Unavailable";
    default: return "Status";
  }
}

// "bytes=N-" or "bytes=N-M"; anything else is treated as no Range (as servers do).
bool ParseRange(std::string_view value, uint64_t* start, std::optional<uint64_t>* end) {
  if (!absl::StartsWith(Sv(value), "bytes=")) return false;
  std::string_view spec = value.substr(6);
  size_t dash = spec.find('-');
  if (dash == std::string_view::npos || dash == 0) return false;
  if (!absl::SimpleAtoi(Sv(spec.substr(0, dash)), start)) return false;
  std::string_view rest = spec.substr(dash + 1);
  if (rest.empty()) {
    end->reset();
    return true;
  }
  uint64_t e = 0;
  if (!absl::SimpleAtoi(Sv(rest), &e) || e < *start) return false;
  *end = e;
  return true;
}

}  // namespace

void FaultHttpServer::State::AcceptLoop() {
  for (;;) {
    pollfd fds[2] = {{listen_fd, POLLIN, 0}, {wake_pipe[0], POLLIN, 0}};
    int r = ::poll(fds, 2, -1);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0 || (fds[1].revents & POLLIN)) return;
    int fd = ::accept4(listen_fd, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0) continue;
    std::lock_guard<std::mutex> l(mu);
    if (stopping) {
      ::close(fd);
      return;
    }
    ++connections;
    open_fds.insert(fd);
    workers.emplace_back([this, fd] { ServeConnection(fd); });
  }
}

void FaultHttpServer::State::CloseConnection(int fd, bool reset) {
  {
    std::lock_guard<std::mutex> l(mu);
    open_fds.erase(fd);
  }
  if (reset) {
    // linger {on, 0}: close() sends RST instead of FIN, a "connection reset by peer".
    linger lg{1, 0};
    ::setsockopt(fd, SOL_SOCKET, SO_LINGER, &lg, sizeof(lg));
  }
  ::close(fd);
}

void FaultHttpServer::State::ServeConnection(int fd) {
  std::string pending;
  char buf[8192];
  for (;;) {
    size_t end;
    while ((end = pending.find("\r\n\r\n")) == std::string::npos) {
      if (pending.size() > 64 * 1024) {
        CloseConnection(fd, false);
        return;
      }
      ssize_t n = ::recv(fd, buf, sizeof(buf), 0);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) {
        CloseConnection(fd, false);
        return;
      }
      pending.append(buf, static_cast<size_t>(n));
    }
    std::string head = pending.substr(0, end);
    pending.erase(0, end + 4);
    if (!HandleRequest(fd, head)) return;  // HandleRequest closed it
  }
}

bool FaultHttpServer::State::HandleRequest(int fd, const std::string& head) {
  std::vector<std::string> lines = absl::StrSplit(head, "\r\n");
  std::vector<std::string> first = absl::StrSplit(lines[0], ' ');
  RecordedRequest req;
  req.method = first.size() > 0 ? first[0] : "";
  req.path = first.size() > 1 ? first[1] : "/";
  if (size_t q = req.path.find('?'); q != std::string::npos) req.path.resize(q);
  bool keep_alive = first.size() > 2 && first[2] == "HTTP/1.1";
  for (size_t i = 1; i < lines.size(); ++i) {
    size_t colon = lines[i].find(':');
    if (colon == std::string::npos) continue;
    std::string name = absl::AsciiStrToLower(lines[i].substr(0, colon));
    std::string value(absl::StripAsciiWhitespace(lines[i].substr(colon + 1)));
    if (name == "range") req.range = value;
    if (name == "host") req.host = value;
    if (name == "connection" && absl::EqualsIgnoreCase(value, "close")) keep_alive = false;
  }

  Fault fault;
  std::optional<std::string> file;
  size_t index;
  {
    std::lock_guard<std::mutex> l(mu);
    auto q = queued.find(req.path);
    if (q != queued.end() && !q->second.empty()) {
      fault = q->second.front();
      q->second.pop_front();
    } else if (auto s = standing.find(req.path); s != standing.end()) {
      fault = s->second;
    }
    if (auto f = files.find(req.path); f != files.end()) file = f->second;
    req.fault = fault.kind;
    index = requests.size();
    requests.push_back(req);
  }
  bool head_only = req.method == "HEAD";
  const std::string conn_header = keep_alive ? "" : "Connection: close\r\n";

  auto simple = [&](int status, std::string extra_headers, std::string body) {
    std::string out = absl::StrCat("HTTP/1.1 ", status, " ", Reason(status), "\r\n",
                                   extra_headers, conn_header,
                                   "Content-Length: ", body.size(), "\r\n\r\n");
    if (!head_only) out += body;
    bool ok = SendAll(fd, out);
    if (!ok || !keep_alive) {
      CloseConnection(fd, false);
      return false;
    }
    return true;
  };

  if (fault.kind == FaultKind::kStatus) {
    std::string extra;
    if (fault.retry_after >= 0) extra = absl::StrCat("Retry-After: ", fault.retry_after, "\r\n");
    return simple(fault.status, extra, absl::StrCat("fault: HTTP ", fault.status, "\n"));
  }
  if (fault.kind == FaultKind::kRedirect) {
    return simple(302, absl::StrCat("Location: ", fault.location, "\r\n"), "");
  }
  if (!file.has_value()) return simple(404, "", "not found\n");

  const std::string& data = *file;
  const uint64_t size = data.size();

  if (fault.kind == FaultKind::kOversize || fault.kind == FaultKind::kOversizeNoLength) {
    uint64_t total = std::max<uint64_t>(fault.bytes, size + 1);
    bool with_length = fault.kind == FaultKind::kOversize;
    std::string hdr = absl::StrCat("HTTP/1.1 200 OK\r\n",
                                   with_length ? conn_header : "Connection: close\r\n");
    if (with_length) absl::StrAppend(&hdr, "Content-Length: ", total, "\r\n");
    hdr += "\r\n";
    if (!SendAll(fd, hdr) || head_only) {
      CloseConnection(fd, false);
      return false;
    }
    bool ok = SendAll(fd, data);
    uint64_t sent = ok ? size : 0;
    std::string junk(64 * 1024, 'J');
    while (ok && sent < total) {
      size_t n = static_cast<size_t>(std::min<uint64_t>(junk.size(), total - sent));
      ok = SendAll(fd, std::string_view(junk).substr(0, n));
      if (ok) sent += n;
    }
    SetSent(index, sent);
    CloseConnection(fd, false);
    return false;
  }

  // Normal service and the faults that corrupt it.
  int status = 200;
  uint64_t begin = 0, last = size == 0 ? 0 : size - 1;
  std::string range_header;
  uint64_t rstart = 0;
  std::optional<uint64_t> rend;
  if (req.range && ParseRange(*req.range, &rstart, &rend) &&
      fault.kind != FaultKind::kIgnoreRange) {
    if (rstart >= size) {
      return simple(416, absl::StrCat("Content-Range: bytes */", size, "\r\n"), "");
    }
    status = 206;
    begin = rstart;
    if (rend) last = std::min(*rend, size - 1);
    uint64_t claimed = begin;
    if (fault.kind == FaultKind::kBadRange || fault.kind == FaultKind::kLyingRange ||
        fault.kind == FaultKind::kLyingShortRange) {
      begin = std::min(begin + 7, last);
      // kBadRange says which range it sends (the wrong one); kLyingRange claims the
      // requested one.
      if (fault.kind == FaultKind::kBadRange) claimed = begin;
    }
    uint64_t claimed_last = claimed + (last - begin);
    if (fault.kind == FaultKind::kLyingRange) claimed_last = last;  // padded below
    range_header = absl::StrCat("Content-Range: bytes ", claimed, "-", claimed_last, "/",
                                size, "\r\n");
  }
  std::string body = size == 0 ? "" : data.substr(begin, last - begin + 1);
  if (fault.kind == FaultKind::kLyingRange && status == 206) {
    body.append(static_cast<size_t>(begin - rstart), 'L');
  }
  if (fault.kind == FaultKind::kWrongBytes) {
    for (uint64_t i = 0; i < body.size(); ++i) {
      uint64_t pos = begin + i;
      if (pos >= fault.bytes && pos % 100 == 0) body[i] = static_cast<char>(body[i] ^ 0xff);
    }
  }
  std::string hdr = absl::StrCat("HTTP/1.1 ", status, " ", Reason(status), "\r\n",
                                 range_header, conn_header, "Accept-Ranges: bytes\r\n",
                                 "Content-Length: ", body.size(), "\r\n\r\n");
  if (!SendAll(fd, hdr)) {
    CloseConnection(fd, false);
    return false;
  }
  if (head_only) {
    if (!keep_alive) CloseConnection(fd, false);
    return keep_alive;
  }
  bool truncating = fault.kind == FaultKind::kResetAfter ||
                    fault.kind == FaultKind::kShortBody || fault.kind == FaultKind::kStall;
  size_t n = truncating ? static_cast<size_t>(std::min<uint64_t>(fault.bytes, body.size()))
                        : body.size();
  bool ok = true;
  if (fault.kind == FaultKind::kThrottle && fault.bytes > 0) {
    size_t off = 0;
    while (ok && off < n) {
      size_t chunk = static_cast<size_t>(std::min<uint64_t>(fault.bytes, n - off));
      ok = SendAll(fd, std::string_view(body).substr(off, chunk));
      if (ok) SetSent(index, chunk);
      off += chunk;
      std::unique_lock<std::mutex> l(mu);
      if (cv.wait_for(l, std::chrono::milliseconds(10), [&] { return stopping; })) ok = false;
    }
  } else {
    ok = SendAll(fd, std::string_view(body).substr(0, n));
    SetSent(index, ok ? n : 0);
  }
  switch (fault.kind) {
    case FaultKind::kResetAfter:
      CloseConnection(fd, /*reset=*/true);
      return false;
    case FaultKind::kShortBody:
      ::shutdown(fd, SHUT_WR);
      CloseConnection(fd, false);
      return false;
    case FaultKind::kStall: {
      std::unique_lock<std::mutex> l(mu);
      cv.wait_for(l, absl::ToChronoMilliseconds(fault.stall), [&] { return stopping; });
      l.unlock();
      CloseConnection(fd, false);
      return false;
    }
    default:
      break;
  }
  if (!ok || !keep_alive) {
    CloseConnection(fd, false);
    return false;
  }
  return true;
}

// ---------------------------------------------------------------------------------

absl::StatusOr<std::unique_ptr<FaultHttpServer>> FaultHttpServer::Start(
    const std::string& address) {
  auto state = std::make_unique<State>();
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return absl::InternalError(absl::StrCat("socket: ", std::strerror(errno)));
  int one = 1;
  ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_port = 0;
  if (::inet_pton(AF_INET, address.c_str(), &sa.sin_addr) != 1) {
    ::close(fd);
    return absl::InvalidArgumentError(absl::StrCat("not an IPv4 address: ", address));
  }
  if (::bind(fd, reinterpret_cast<sockaddr*>(&sa), sizeof(sa)) != 0 ||
      ::listen(fd, 128) != 0) {
    int err = errno;
    ::close(fd);
    return absl::UnavailableError(absl::StrCat("bind ", address, ": ", std::strerror(err)));
  }
  socklen_t len = sizeof(sa);
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&sa), &len);
  state->listen_fd = fd;
  if (::pipe2(state->wake_pipe, O_CLOEXEC) != 0) {
    ::close(fd);
    return absl::InternalError("pipe2 failed");
  }
  int port = ntohs(sa.sin_port);
  State* s = state.get();
  state->acceptor = std::thread([s] { s->AcceptLoop(); });
  return std::unique_ptr<FaultHttpServer>(
      new FaultHttpServer(address, port, std::move(state)));
}

FaultHttpServer::FaultHttpServer(std::string address, int port, std::unique_ptr<State> state)
    : address_(std::move(address)), port_(port), state_(std::move(state)) {}

FaultHttpServer::~FaultHttpServer() { Stop(); }

void FaultHttpServer::Stop() {
  if (!state_->acceptor.joinable()) return;
  {
    std::lock_guard<std::mutex> l(state_->mu);
    state_->stopping = true;
    // Connections blocked in recv()/send() return at once after a shutdown.
    for (int fd : state_->open_fds) ::shutdown(fd, SHUT_RDWR);
  }
  state_->cv.notify_all();
  (void)!::write(state_->wake_pipe[1], "x", 1);
  state_->acceptor.join();
  std::vector<std::thread> workers;
  {
    std::lock_guard<std::mutex> l(state_->mu);
    workers.swap(state_->workers);
  }
  for (std::thread& t : workers) t.join();
  ::close(state_->listen_fd);
  ::close(state_->wake_pipe[0]);
  ::close(state_->wake_pipe[1]);
}

void FaultHttpServer::Serve(const std::string& path, std::string body) {
  std::lock_guard<std::mutex> l(state_->mu);
  state_->files[path] = std::move(body);
}

void FaultHttpServer::PushFault(const std::string& path, Fault fault) {
  std::lock_guard<std::mutex> l(state_->mu);
  state_->queued[path].push_back(std::move(fault));
}

void FaultHttpServer::SetFault(const std::string& path, Fault fault) {
  std::lock_guard<std::mutex> l(state_->mu);
  if (fault.kind == FaultKind::kNone) {
    state_->standing.erase(path);
  } else {
    state_->standing[path] = std::move(fault);
  }
}

std::string FaultHttpServer::Url(std::string_view path) const {
  return absl::StrCat("http://", address_, ":", port_, Sv(path));
}

std::vector<RecordedRequest> FaultHttpServer::Requests() const {
  std::lock_guard<std::mutex> l(state_->mu);
  return state_->requests;
}

int FaultHttpServer::Count(std::string_view path) const {
  std::lock_guard<std::mutex> l(state_->mu);
  int n = 0;
  for (const RecordedRequest& r : state_->requests) n += r.path == path;
  return n;
}

int FaultHttpServer::Connections() const {
  std::lock_guard<std::mutex> l(state_->mu);
  return state_->connections;
}

}  // namespace cubist::testing
