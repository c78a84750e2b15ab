// libcubist_moe_shim.so: a C entry point into the real engine API (Runtime + MoeGemm) for
// bench/moe_bench.py, which times our kernels and torch's grouped GEMMs side by side in
// one process on torch's tensors and stream. Benchmark plumbing, not a product API
// (issue 13 is the Python package); every call goes through the same Run an engine calls.
//
//   void* cubist_shim_open(manifest, cache_dir)      null on error (cubist_shim_error)
//   int   cubist_shim_candidates(h, wf, af, act, E, T, N, K, buf, len)
//         the kernels that can solve the problem, the cost model's ranking order,
//         '\n'-separated into buf; returns their number, -1 on error
//   int   cubist_shim_run(h, pinned, wf, af, act, E, T, N, K, ptrs[11], stream)
//         MoeGemm::Run with `pinned` ("" = the untuned selection); 0 ok, -1 error.
//         ptrs: a, b, a_scale, b_scale, a_global_scale, b_global_scale, offsets,
//         alpha, beta, limit, out (0 = absent)
#include <cstdint>
#include <cstring>
#include <map>
#include <memory>
#include <string>

#include "base/status_macros.h"
#include "dispatch/moe_gemm.h"
#include "dispatch/runtime.h"
#include "dispatch/selector.h"

namespace {

thread_local std::string t_error;

struct Shim {
  std::unique_ptr<cubist::Runtime> runtime;
  std::map<std::string, std::unique_ptr<cubist::MoeGemm>> ops;  // by pinned name
};

int Fail(const absl::Status& s) {
  t_error = std::string(s.message());
  return -1;
}

absl::StatusOr<cubist::MoeGemmArgs> ArgsOf(const char* wf, const char* af, const char* act,
                                           int64_t e, int64_t t, int64_t n, int64_t k,
                                           const uint64_t* ptrs) {
  cubist::MoeGemmArgs a;
  CUBIST_ASSIGN_OR_RETURN(a.weight_format, cubist::ParseDataFormat(wf));
  CUBIST_ASSIGN_OR_RETURN(a.activation_format, cubist::ParseDataFormat(af));
  CUBIST_ASSIGN_OR_RETURN(a.activation, cubist::ParseActivation(act));
  a.experts = e;
  a.tokens = t;
  a.n = n;
  a.k = k;
  if (ptrs != nullptr) {
    a.a = ptrs[0];
    a.b = ptrs[1];
    a.a_scale = ptrs[2];
    a.b_scale = ptrs[3];
    a.a_global_scale = ptrs[4];
    a.b_global_scale = ptrs[5];
    a.offsets = ptrs[6];
    a.alpha = ptrs[7];
    a.beta = ptrs[8];
    a.limit = ptrs[9];
    a.out = ptrs[10];
  }
  return a;
}

absl::StatusOr<cubist::MoeGemm*> Op(Shim* s, const std::string& pinned) {
  auto it = s->ops.find(pinned);
  if (it != s->ops.end()) return it->second.get();
  cubist::MoeGemmOptions o;
  o.pinned_kernel = pinned;
  CUBIST_ASSIGN_OR_RETURN(std::unique_ptr<cubist::MoeGemm> op,
                          cubist::MoeGemm::Create(*s->runtime, o));
  cubist::MoeGemm* raw = op.get();
  s->ops[pinned] = std::move(op);
  return raw;
}

}  // namespace

extern "C" {

__attribute__((visibility("default"))) const char* cubist_shim_error() {
  return t_error.c_str();
}

__attribute__((visibility("default"))) void* cubist_shim_open(const char* manifest,
                                                              const char* cache_dir) {
  cubist::RuntimeOptions o;
  o.manifest = manifest;
  o.cache_dir = cache_dir != nullptr ? cache_dir : "";
  o.tuning_file = "none";  // untuned selection: the cost model alone
  o.preload = true;
  auto rt = cubist::Runtime::Open(o);
  if (!rt.ok()) {
    Fail(rt.status());
    return nullptr;
  }
  auto* s = new Shim;
  s->runtime = std::move(*rt);
  return s;
}

__attribute__((visibility("default"))) void cubist_shim_close(void* h) {
  delete static_cast<Shim*>(h);
}

__attribute__((visibility("default"))) int cubist_shim_candidates(
    void* h, const char* wf, const char* af, const char* act, int64_t e, int64_t t,
    int64_t n, int64_t k, char* buf, int len) {
  auto* s = static_cast<Shim*>(h);
  auto args = ArgsOf(wf, af, act, e, t, n, k, nullptr);
  if (!args.ok()) return Fail(args.status());
  auto op = Op(s, "");
  if (!op.ok()) return Fail(op.status());
  cubist::SelectOptions so;
  so.abi = cubist::moe::kMoeGemmAbi;
  auto ranked = cubist::RankCandidates(s->runtime->registry(), (*op)->ProblemOf(*args), so);
  if (!ranked.ok()) return Fail(ranked.status());
  std::string out;
  for (const cubist::Candidate& c : *ranked) out += c.kernel->name() + "\n";
  if (static_cast<int>(out.size()) >= len) {
    return Fail(absl::ResourceExhaustedError("cubist_shim_candidates: buffer too small"));
  }
  std::memcpy(buf, out.c_str(), out.size() + 1);
  return static_cast<int>(ranked->size());
}

__attribute__((visibility("default"))) int cubist_shim_run(
    void* h, const char* pinned, const char* wf, const char* af, const char* act, int64_t e,
    int64_t t, int64_t n, int64_t k, const uint64_t* ptrs, void* stream) {
  auto* s = static_cast<Shim*>(h);
  auto args = ArgsOf(wf, af, act, e, t, n, k, ptrs);
  if (!args.ok()) return Fail(args.status());
  auto op = Op(s, pinned != nullptr ? pinned : "");
  if (!op.ok()) return Fail(op.status());
  absl::Status st = (*op)->Run(*args, static_cast<CUstream>(stream));
  if (!st.ok()) return Fail(st);
  return 0;
}

}  // extern "C"
