#include "artifacts/oci_client.h"

#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <random>

#include <nlohmann/json.hpp>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "artifacts/credential_helper.h"
#include "artifacts/curl_library.h"
#include "artifacts/curl_options.h"
#include "artifacts/curl_transport.h"
#include "artifacts/fetch_policy.h"
#include "base/clock.h"
#include "base/file_util.h"
#include "base/status_macros.h"
#include "base/strings.h"

namespace cubist {
namespace {

// A failed libcurl transfer: a TLS trust failure is PermissionDenied with the fix (no
// retry makes it work), anything else Unavailable.
absl::Status TransferError(CURLcode rc, std::string message) {
  if (TransportResultOf(rc) == TransportResult::kUntrusted) {
    return absl::PermissionDeniedError(absl::StrCat(message, ": ", kUntrustedServerFix));
  }
  return absl::UnavailableError(std::move(message));
}

std::string OriginOf(std::string_view url) {
  size_t scheme = url.find("://");
  if (scheme == std::string_view::npos) return "";
  size_t slash = url.find('/', scheme + 3);
  return std::string(url.substr(0, slash == std::string_view::npos ? url.size() : slash + 1));
}

// "https://r.example:5000/v2/" -> "r.example:5000": docker config keys come in both
// forms (and "index.docker.io/v1/" for Docker Hub).
std::string NormalizeConfigKey(std::string_view key) {
  std::string_view k = key;
  size_t scheme = k.find("://");
  if (scheme != std::string_view::npos) k = k.substr(scheme + 3);
  return std::string(k.substr(0, k.find('/')));
}

absl::StatusOr<RegistryCredentials> FromConfigFile(const std::string& path,
                                                   std::string_view host) {
  auto text = ReadFileToString(path, 4 << 20);
  if (!text.ok()) return RegistryCredentials{};  // no such file: anonymous
  nlohmann::json j = nlohmann::json::parse(*text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(
        path, ": not a JSON object; fix or remove the registry credentials file"));
  }
  // Docker's order: a helper for this registry, else the store for all registries,
  // else the file's own "auths" entry (also when the helper has nothing for the host).
  std::string helper;
  if (auto h = j.find("credHelpers"); h != j.end() && h->is_object()) {
    for (auto it = h->begin(); it != h->end(); ++it) {
      if (NormalizeConfigKey(it.key()) == host && it->is_string()) helper = it->get<std::string>();
    }
  }
  if (auto s = j.find("credsStore"); helper.empty() && s != j.end() && s->is_string()) {
    helper = s->get<std::string>();
  }
  if (!helper.empty()) {
    auto got = RunCredentialHelper(helper, host);
    if (!got.ok()) {
      return absl::Status(got.status().code(),
                          absl::StrCat(path, ": ", got.status().message()));
    }
    if (got->has_value()) {
      RegistryCredentials c;
      c.username = (*got)->username;
      c.password = (*got)->secret;
      c.origin = absl::StrCat("docker-credential-", helper, " (", path, ")");
      return c;
    }
  }
  auto auths = j.find("auths");
  if (auths == j.end() || !auths->is_object()) return RegistryCredentials{};
  for (auto it = auths->begin(); it != auths->end(); ++it) {
    if (NormalizeConfigKey(it.key()) != host || !it->is_object()) continue;
    RegistryCredentials c;
    c.origin = path;
    if (auto a = it->find("auth"); a != it->end() && a->is_string()) {
      std::string decoded;
      if (!absl::Base64Unescape(a->get<std::string>(), &decoded) ||
          decoded.find(':') == std::string::npos) {
        return absl::InvalidArgumentError(absl::StrCat(
            path, ": auths[\"", it.key(),
            "\"].auth is not base64 of USER:PASSWORD; log in again (docker login) or "
            "fix the file"));
      }
      size_t colon = decoded.find(':');
      c.username = decoded.substr(0, colon);
      c.password = decoded.substr(colon + 1);
      return c;
    }
    if (auto u = it->find("username"); u != it->end() && u->is_string()) {
      c.username = u->get<std::string>();
    }
    if (auto p = it->find("password"); p != it->end() && p->is_string()) {
      c.password = p->get<std::string>();
    }
    return c;
  }
  return RegistryCredentials{};
}

size_t AppendBody(char* p, size_t size, size_t n, void* user) {
  auto* out = static_cast<std::pair<std::string*, uint64_t>*>(user);
  size_t len = size * n;
  if (out->first->size() + len > out->second) return 0;  // too large: abort
  out->first->append(p, len);
  return len;
}

size_t CollectHeader(char* p, size_t size, size_t n, void* user) {
  auto* headers = static_cast<std::map<std::string, std::string>*>(user);
  std::string_view line(p, size * n);
  if (absl::StartsWith(Sv(line), "HTTP/")) {
    headers->clear();  // a new response (after 100 Continue or a redirect)
    return size * n;
  }
  size_t colon = line.find(':');
  if (colon != std::string_view::npos) {
    std::string name = absl::AsciiStrToLower(Sv(line.substr(0, colon)));
    std::string value(absl::StripAsciiWhitespace(Sv(line.substr(colon + 1))));
    (*headers)[name] = value;
  }
  return size * n;
}

struct FileReader {
  const HttpBody* body;
  uint64_t done = 0;
  int error = 0;
};

size_t ReadBody(char* buf, size_t size, size_t n, void* user) {
  auto* r = static_cast<FileReader*>(user);
  uint64_t left = r->body->length - r->done;
  size_t want = static_cast<size_t>(std::min<uint64_t>(left, size * n));
  if (want == 0) return 0;
  ssize_t got = ::pread(r->body->fd, buf, want, static_cast<off_t>(r->body->offset + r->done));
  if (got <= 0) {
    r->error = got < 0 ? errno : EIO;
    return CURL_READFUNC_ABORT;
  }
  r->done += static_cast<uint64_t>(got);
  return static_cast<size_t>(got);
}

// Registries speak HTTP(S) only; redirects are enabled per request (SendOnce).
void CommonOptions(const CurlApi& curl, CURL* e, absl::Duration timeout) {
  CurlOptions options;
  options.protocols = "http,https";
  options.follow_redirects = false;
  options.total_timeout = timeout;
  options.ca = CaSettings::FromEnvironment();
  ApplyCurlOptions(curl, e, options);
}

std::string UrlEncode(std::string_view s) {
  std::string out;
  for (unsigned char c : s) {
    if (absl::ascii_isalnum(c) || c == '-' || c == '.' || c == '_' || c == '~') {
      out.push_back(static_cast<char>(c));
    } else {
      absl::StrAppend(&out, "%", absl::Hex(c, absl::kZeroPad2));
    }
  }
  return out;
}

}  // namespace

absl::StatusOr<RegistryCredentials> LookUpRegistryCredentials(std::string_view host) {
  const char* user = std::getenv("CUBIST_REGISTRY_USERNAME");
  const char* pass = std::getenv("CUBIST_REGISTRY_PASSWORD");
  if ((user != nullptr && *user != '\0') || (pass != nullptr && *pass != '\0')) {
    RegistryCredentials c;
    c.username = user != nullptr ? user : "";
    c.password = pass != nullptr ? pass : "";
    c.origin = "CUBIST_REGISTRY_USERNAME/CUBIST_REGISTRY_PASSWORD";
    return c;
  }
  std::vector<std::string> files;
  if (const char* f = std::getenv("REGISTRY_AUTH_FILE"); f != nullptr && *f != '\0') {
    files.push_back(f);
  } else if (const char* d = std::getenv("DOCKER_CONFIG"); d != nullptr && *d != '\0') {
    files.push_back(absl::StrCat(d, "/config.json"));
  } else if (const char* h = std::getenv("HOME"); h != nullptr && *h != '\0') {
    files.push_back(absl::StrCat(h, "/.docker/config.json"));
  }
  for (const std::string& f : files) {
    auto c = FromConfigFile(f, host);
    if (!c.ok() || !c->empty()) return c;
  }
  return RegistryCredentials{};
}

absl::StatusOr<AuthChallenge> ParseAuthChallenge(std::string_view header) {
  AuthChallenge c;
  std::string_view h = Sv(absl::StripAsciiWhitespace(Sv(header)));
  size_t sp = h.find(' ');
  c.scheme = absl::AsciiStrToLower(Sv(h.substr(0, sp)));
  if (c.scheme.empty()) {
    return absl::InvalidArgumentError("empty WWW-Authenticate header");
  }
  if (sp == std::string_view::npos) return c;
  std::string_view rest = h.substr(sp + 1);
  size_t i = 0;
  while (i < rest.size()) {
    while (i < rest.size() && (rest[i] == ' ' || rest[i] == ',')) ++i;
    size_t eq = rest.find('=', i);
    if (eq == std::string_view::npos) break;
    std::string key = absl::AsciiStrToLower(absl::StripAsciiWhitespace(Sv(rest.substr(i, eq - i))));
    i = eq + 1;
    std::string value;
    if (i < rest.size() && rest[i] == '"') {
      ++i;
      while (i < rest.size() && rest[i] != '"') {
        if (rest[i] == '\\' && i + 1 < rest.size()) ++i;
        value.push_back(rest[i++]);
      }
      if (i >= rest.size()) {
        return absl::InvalidArgumentError(absl::StrCat(
            "WWW-Authenticate: unterminated quoted value of '", key, "'"));
      }
      ++i;  // closing quote
    } else {
      size_t end = rest.find(',', i);
      if (end == std::string_view::npos) end = rest.size();
      value = std::string(absl::StripAsciiWhitespace(Sv(rest.substr(i, end - i))));
      i = end;
    }
    c.params[key] = value;
  }
  return c;
}

RegistryAuth::RegistryAuth(OciReference ref, RegistryCredentials credentials, std::string scope)
    : ref_(std::move(ref)),
      credentials_(std::move(credentials)),
      scope_(std::move(scope)),
      origin_(OriginOf(ref_.RepositoryUrl())) {}

std::string RegistryAuth::HeaderFor(std::string_view url) const {
  if (!absl::StartsWith(Sv(url), origin_)) return "";
  absl::MutexLock lock(&mu_);
  return header_;
}

std::string RegistryAuth::RefusedMessage(std::string_view what) const {
  if (credentials_.empty()) {
    return absl::StrCat(
        "registry ", ref_.host, " requires a login for ", ref_.repository, " (", Sv(what),
        "); set CUBIST_REGISTRY_USERNAME and CUBIST_REGISTRY_PASSWORD, or log in with a "
        "docker-style client so that ~/.docker/config.json (or $DOCKER_CONFIG, "
        "$REGISTRY_AUTH_FILE) holds credentials for ", ref_.host);
  }
  return absl::StrCat("registry ", ref_.host, " refused the credentials of user '",
                      credentials_.username, "' from ", credentials_.origin, " for ",
                      ref_.repository, " (", Sv(what),
                      "); check the user name and password, and that the user may access "
                      "this repository");
}

absl::StatusOr<std::string> RegistryAuth::FetchToken(const AuthChallenge& challenge) {
  auto realm = challenge.params.find("realm");
  if (realm == challenge.params.end() || realm->second.empty()) {
    return absl::PermissionDeniedError(absl::StrCat(
        "registry ", ref_.host, " asked for a bearer token without naming a token "
        "endpoint (no realm in WWW-Authenticate); the registry is misconfigured"));
  }
  std::string url = realm->second;
  if (!absl::StartsWithIgnoreCase(url, "https://") &&
      !absl::StartsWithIgnoreCase(url, "http://")) {
    return absl::PermissionDeniedError(absl::StrCat(
        "registry ", ref_.host, ": token endpoint '", url, "' is not an http(s) URL"));
  }
  std::vector<std::string> query;
  if (auto s = challenge.params.find("service"); s != challenge.params.end()) {
    query.push_back(absl::StrCat("service=", UrlEncode(s->second)));
  }
  // The challenge's scope when it names one (it knows what this request needs); ours
  // too, so that one token serves the whole fetch or push.
  std::string scope = scope_;
  if (auto s = challenge.params.find("scope"); s != challenge.params.end() &&
                                               !s->second.empty() && s->second != scope_) {
    query.push_back(absl::StrCat("scope=", UrlEncode(s->second)));
  }
  query.push_back(absl::StrCat("scope=", UrlEncode(scope)));
  url += (url.find('?') == std::string::npos ? "?" : "&") + absl::StrJoin(query, "&");

  CUBIST_ASSIGN_OR_RETURN(const CurlApi* curl, LoadCurl());
  CurlEasy easy(curl->easy_init());
  CURL* e = easy.get();
  CommonOptions(*curl, e, absl::Seconds(60));
  std::string body;
  std::pair<std::string*, uint64_t> sink{&body, 1 << 20};
  char errbuf[CURL_ERROR_SIZE] = {0};
  curl->easy_setopt(e, CURLOPT_URL, url.c_str());
  curl->easy_setopt(e, CURLOPT_WRITEFUNCTION, &AppendBody);
  curl->easy_setopt(e, CURLOPT_WRITEDATA, &sink);
  curl->easy_setopt(e, CURLOPT_ERRORBUFFER, errbuf);
  if (!credentials_.empty()) {
    curl->easy_setopt(e, CURLOPT_HTTPAUTH, CURLAUTH_BASIC);
    curl->easy_setopt(e, CURLOPT_USERNAME, credentials_.username.c_str());
    curl->easy_setopt(e, CURLOPT_PASSWORD, credentials_.password.c_str());
  }
  CURLcode rc = curl->easy_perform(e);
  long code = 0;
  curl->easy_getinfo(e, CURLINFO_RESPONSE_CODE, &code);
  if (rc != CURLE_OK) {
    return TransferError(rc, absl::StrCat("registry ", ref_.host, ": token endpoint ",
                                          realm->second, ": ",
                                          errbuf[0] ? errbuf : curl->easy_strerror(rc)));
  }
  if (code == 401 || code == 403) {
    return absl::PermissionDeniedError(
        RefusedMessage(absl::StrCat("token endpoint answered HTTP ", code)));
  }
  if (code != 200) {
    return absl::UnavailableError(absl::StrCat("registry ", ref_.host, ": token endpoint ",
                                               realm->second, " answered HTTP ", code));
  }
  nlohmann::json j = nlohmann::json::parse(body, nullptr, /*allow_exceptions=*/false);
  for (const char* key : {"token", "access_token"}) {
    if (j.is_object() && j.contains(key) && j[key].is_string() &&
        !j[key].get<std::string>().empty()) {
      return j[key].get<std::string>();
    }
  }
  return absl::PermissionDeniedError(absl::StrCat(
      "registry ", ref_.host, ": token endpoint ", realm->second,
      " answered without a token (no \"token\" or \"access_token\" string)"));
}

absl::Status RegistryAuth::Answer(std::string_view www_authenticate,
                                  const std::string& sent_header) {
  absl::MutexLock lock(&mu_);
  if (header_ != sent_header) return absl::OkStatus();  // renewed by another thread
  if (++answers_ > 8) {
    return absl::PermissionDeniedError(RefusedMessage("refused repeatedly"));
  }
  if (www_authenticate.empty()) {
    return absl::PermissionDeniedError(RefusedMessage("HTTP 401 without a challenge"));
  }
  auto challenge = ParseAuthChallenge(www_authenticate);
  if (!challenge.ok()) {
    return absl::PermissionDeniedError(absl::StrCat(
        "registry ", ref_.host, ": unreadable authentication challenge: ",
        challenge.status().message()));
  }
  if (challenge->scheme == "basic") {
    if (credentials_.empty() || absl::StartsWith(sent_header, "Authorization: Basic ")) {
      return absl::PermissionDeniedError(RefusedMessage("HTTP basic authentication"));
    }
    header_ = absl::StrCat("Authorization: Basic ",
                           absl::Base64Escape(absl::StrCat(credentials_.username, ":",
                                                           credentials_.password)));
    return absl::OkStatus();
  }
  if (challenge->scheme == "bearer") {
    // A token that was just issued and is refused again means the token server gave
    // less than the registry wants (anonymous pull of a private repository, or push
    // without the right).
    if (absl::StartsWith(sent_header, "Authorization: Bearer ") &&
        challenge->params.count("error") == 0 && answers_ > 2) {
      return absl::PermissionDeniedError(RefusedMessage("bearer token refused"));
    }
    auto token = FetchToken(*challenge);
    if (!token.ok()) return token.status();
    header_ = absl::StrCat("Authorization: Bearer ", *token);
    return absl::OkStatus();
  }
  return absl::PermissionDeniedError(absl::StrCat(
      "registry ", ref_.host, " asks for '", challenge->scheme,
      "' authentication; cubist speaks basic and bearer (token) authentication"));
}

std::string HttpResponse::Header(std::string_view name) const {
  auto it = headers.find(absl::AsciiStrToLower(Sv(name)));
  return it == headers.end() ? "" : it->second;
}

RegistryClient::RegistryClient(std::shared_ptr<RegistryAuth> auth, absl::Duration timeout)
    : auth_(std::move(auth)), timeout_(timeout) {}

std::string RegistryClient::Url(std::string_view relative) const {
  if (absl::StartsWith(Sv(relative), "http://") || absl::StartsWith(Sv(relative), "https://")) {
    return std::string(relative);
  }
  if (absl::StartsWith(Sv(relative), "/")) {
    // An absolute path (upload Locations often are): on the registry's origin.
    std::string repo = auth_->ref().RepositoryUrl();
    return absl::StrCat(OriginOf(repo).substr(0, OriginOf(repo).size() - 1), Sv(relative));
  }
  return absl::StrCat(auth_->ref().RepositoryUrl(), Sv(relative));
}

absl::StatusOr<HttpResponse> RegistryClient::SendOnce(std::string_view method,
                                                      const std::string& url,
                                                      const std::vector<std::string>& headers,
                                                      const HttpBody& body, uint64_t max_body,
                                                      std::string* sent_auth) {
  if (curl_ == nullptr) {
    // The first request loads libcurl (curl_library.h); one handle serves them all.
    CUBIST_ASSIGN_OR_RETURN(curl_, LoadCurl());
    easy_.reset(curl_->easy_init());
  }
  CURL* e = easy_.get();
  curl_->easy_reset(e);  // keeps the connection cache
  CommonOptions(*curl_, e, timeout_);
  HttpResponse response;
  std::pair<std::string*, uint64_t> sink{&response.body, max_body};
  char errbuf[CURL_ERROR_SIZE] = {0};
  curl_->easy_setopt(e, CURLOPT_URL, url.c_str());
  curl_->easy_setopt(e, CURLOPT_ERRORBUFFER, errbuf);
  curl_->easy_setopt(e, CURLOPT_WRITEFUNCTION, &AppendBody);
  curl_->easy_setopt(e, CURLOPT_WRITEDATA, &sink);
  curl_->easy_setopt(e, CURLOPT_HEADERFUNCTION, &CollectHeader);
  curl_->easy_setopt(e, CURLOPT_HEADERDATA, &response.headers);
  // Registries may redirect blob reads to storage (S3, a CDN); libcurl drops our
  // Authorization header when the host changes.
  curl_->easy_setopt(e, CURLOPT_FOLLOWLOCATION, method == "GET" || method == "HEAD" ? 1L : 0L);
  CurlSlist list;
  *sent_auth = auth_->HeaderFor(url);
  auto add = [&](const std::string& h) {
    curl_slist* n = curl_->slist_append(list.get(), h.c_str());
    if (n != nullptr) {
      list.release();
      list.reset(n);
    }
  };
  if (!sent_auth->empty()) add(*sent_auth);
  for (const std::string& h : headers) add(h);
  FileReader reader{&body};
  if (method == "HEAD") {
    curl_->easy_setopt(e, CURLOPT_NOBODY, 1L);
  } else if (method == "GET") {
    curl_->easy_setopt(e, CURLOPT_HTTPGET, 1L);
  } else {
    curl_->easy_setopt(e, CURLOPT_CUSTOMREQUEST, std::string(method).c_str());
    add("Expect:");  // no 100-continue round trip per blob
    if (body.from_file()) {
      // Streamed from disk (UPLOAD sends PUT; CUSTOMREQUEST renames it).
      curl_->easy_setopt(e, CURLOPT_UPLOAD, 1L);
      curl_->easy_setopt(e, CURLOPT_INFILESIZE_LARGE, static_cast<curl_off_t>(body.size()));
      curl_->easy_setopt(e, CURLOPT_READFUNCTION, &ReadBody);
      curl_->easy_setopt(e, CURLOPT_READDATA, &reader);
    } else {
      curl_->easy_setopt(e, CURLOPT_POST, 1L);
      curl_->easy_setopt(e, CURLOPT_POSTFIELDSIZE_LARGE, static_cast<curl_off_t>(body.data.size()));
      curl_->easy_setopt(e, CURLOPT_POSTFIELDS, body.data.empty() ? "" : body.data.data());
    }
  }
  curl_->easy_setopt(e, CURLOPT_HTTPHEADER, list.get());
  CURLcode rc = curl_->easy_perform(e);
  curl_->easy_setopt(e, CURLOPT_HTTPHEADER, nullptr);
  if (rc == CURLE_WRITE_ERROR && response.body.size() >= max_body) {
    return absl::InvalidArgumentError(absl::StrCat(
        Sv(method), " ", url, ": the answer is larger than ", max_body, " bytes"));
  }
  if (rc != CURLE_OK) {
    std::string why = errbuf[0] ? errbuf : curl_->easy_strerror(rc);
    if (reader.error != 0) why = absl::StrCat("reading the upload: ", strerror(reader.error));
    return TransferError(rc, absl::StrCat(Sv(method), " ", url, ": ", why));
  }
  curl_->easy_getinfo(e, CURLINFO_RESPONSE_CODE, &response.status);
  return response;
}

absl::StatusOr<HttpResponse> RegistryClient::Send(std::string_view method, std::string_view url,
                                                  const std::vector<std::string>& headers,
                                                  HttpBody body, uint64_t max_body,
                                                  int attempts) {
  std::string full = Url(url);
  std::mt19937_64 rng(std::random_device{}());
  absl::Status last;
  int challenges = 0;
  for (int attempt = 0; attempt < std::max(1, attempts);) {
    std::string sent_auth;
    auto r = SendOnce(method, full, headers, body, max_body, &sent_auth);
    bool retry = false;
    if (!r.ok()) {
      if (r.status().code() != absl::StatusCode::kUnavailable) return r;
      last = r.status();
      retry = true;
    } else if (r->status == 401 && challenges < 3) {
      ++challenges;
      absl::Status answered = auth_->Answer(r->Header("www-authenticate"), sent_auth);
      if (!answered.ok()) return answered;
      continue;  // an answered challenge is not a failed attempt
    } else if (r->status >= 500 || r->status == 429 || r->status == 408) {
      last = RegistryError(*r, absl::StrCat(Sv(method), " ", full));
      retry = true;
    } else {
      return r;
    }
    ++attempt;
    if (!retry || attempt >= attempts) break;
    // The same backoff as artifacts and manifests (fetch_policy.h).
    std::uniform_real_distribution<double> jitter(0.0, 1.0);
    Clock::Real().SleepFor(BackoffDelay(attempt, RetryPolicy(), std::nullopt, jitter(rng)));
  }
  return absl::Status(last.code(),
                      absl::StrCat(last.message(), " (", std::max(1, attempts), " attempts)"));
}

absl::Status RegistryClient::Ping() {
  std::string repo = auth_->ref().RepositoryUrl();
  auto r = Send("GET", OriginOf(repo) + "v2/", {}, {}, 1 << 20);
  if (!r.ok()) return r.status();
  if (r->status == 200) return absl::OkStatus();
  if (r->status == 404) {
    return absl::NotFoundError(absl::StrCat(
        auth_->ref().host, " answered HTTP 404 to GET /v2/: this is not an OCI registry "
        "(distribution API v2); check the host and port"));
  }
  return RegistryError(*r, "GET /v2/");
}

absl::Status RegistryError(const HttpResponse& response, std::string_view what) {
  std::string detail;
  nlohmann::json j = nlohmann::json::parse(response.body, nullptr, false);
  if (j.is_object() && j.contains("errors") && j["errors"].is_array()) {
    std::vector<std::string> parts;
    for (const auto& e : j["errors"]) {
      if (!e.is_object()) continue;
      std::string code = e.value("code", "");
      std::string msg = e.value("message", "");
      parts.push_back(code.empty() ? msg : absl::StrCat(code, " (", msg, ")"));
    }
    detail = absl::StrJoin(parts, "; ");
  }
  std::string msg = absl::StrCat(Sv(what), ": HTTP ", response.status,
                                 detail.empty() ? "" : ": ", detail);
  long s = response.status;
  if (s == 404) return absl::NotFoundError(msg);
  if (s == 401 || s == 403) return absl::PermissionDeniedError(msg);
  if (s >= 500 || s == 429 || s == 408) return absl::UnavailableError(msg);
  return absl::FailedPreconditionError(msg);
}

}  // namespace cubist
