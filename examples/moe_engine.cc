// How an inference engine uses cubist for the MoE layer's batched GEMM (FC1 with
// SwiGLU), from startup to the per-step call. Copy this.
//
//   cubist_example_moe_engine MANIFEST [--experts 128] [--tokens-per-expert 16]
//                             [--n 1536] [--k 2048] [--weights bf16] [--activations bf16]
//
// Startup (once per process and GPU):
//   1. Runtime::Open: reads and checks the manifest, fetches this GPU's kernels into the
//      node's shared cache (one download per node), and, with `preload`, loads them so
//      that nothing is loaded later (e.g. during CUDA-graph capture).
//   2. MoeGemm::Create, then CanImplement for each shape the engine will run (this
//      selects and caches the kernel, so the step path never selects).
// Every step:
//   3. MoeGemm::Run(args, stream): a lock-free lookup and cuLaunchKernelEx.
//
// Errors are absl::Status values with a message that says what to do; nothing throws.
// The program fills the operands with small random values and prints a checksum of
// the output, so it also works as a smoke test on a new machine.
#include <cstdio>
#include <cstdlib>
#include <algorithm>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "base/status_macros.h"
#include "dispatch/moe_gemm.h"
#include "dispatch/runtime.h"
#include "loader/device_memory.h"

namespace {

struct Flags {
  std::string manifest;
  // Qwen3-30B-A3B's FC1 at 16 tokens per expert.
  int64_t experts = 128, tokens_per_expert = 16, n = 1536, k = 2048;
  std::string weights = "bf16", activations = "bf16";
};

// bf16 bits of x (round to nearest even); enough for test data.
uint16_t ToBf16(float x) {
  uint32_t u;
  std::memcpy(&u, &x, 4);
  return static_cast<uint16_t>((u + 0x7FFF + ((u >> 16) & 1)) >> 16);
}

absl::Status Main(const Flags& f) {
  // --- 1. startup ---------------------------------------------------------------
  cubist::RuntimeOptions options;
  options.manifest = f.manifest;  // URL or path; the cache dir comes from the environment
  options.preload = true;
  CUBIST_ASSIGN_OR_RETURN(std::unique_ptr<cubist::Runtime> runtime,
                          cubist::Runtime::Open(options));
  CUBIST_RETURN_IF_ERROR(runtime->MakeCurrent());  // an engine using cudart has this
  std::printf("device %s (SM %d, %d SMs), %zu kernels in %s\n",
              runtime->device_name().c_str(), runtime->sm().number(),
              runtime->device_info().sm_count, runtime->registry().size(),
              runtime->manifest().source.c_str());
  CUBIST_ASSIGN_OR_RETURN(std::unique_ptr<cubist::MoeGemm> gemm,
                          cubist::MoeGemm::Create(*runtime));

  // --- the layer's buffers (the engine owns these) ------------------------------
  cubist::DriverApi& driver = runtime->driver();
  cubist::MoeGemmArgs args;
  CUBIST_ASSIGN_OR_RETURN(args.weight_format, cubist::ParseDataFormat(f.weights));
  CUBIST_ASSIGN_OR_RETURN(args.activation_format, cubist::ParseDataFormat(f.activations));
  if (args.weight_format != cubist::DataFormat::kBf16 ||
      args.activation_format != cubist::DataFormat::kBf16) {
    return absl::UnimplementedError(
        "this example fills bf16 operands only; `cubist run` handles every format");
  }
  args.activation = cubist::Activation::kSwiglu;
  args.experts = f.experts;
  args.tokens = f.experts * f.tokens_per_expert;
  args.n = f.n;
  args.k = f.k;
  // Stand-in data: one block of random values (1M, an odd count so that rows differ),
  // repeated. An engine would upload its real weights here.
  std::mt19937 rng(1);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> block((size_t{1} << 20) + 7);
  for (float& v : block) v = normal(rng);
  auto upload_bf16 = [&](size_t count, float scale,
                         cubist::DeviceBuffer* buf) -> absl::Status {
    CUBIST_ASSIGN_OR_RETURN(*buf, cubist::DeviceBuffer::Allocate(driver, count * 2));
    std::vector<uint16_t> host(block.size());
    for (size_t i = 0; i < block.size(); ++i) host[i] = ToBf16(block[i] * scale);
    for (size_t done = 0; done < count; done += host.size()) {
      const size_t n = std::min(host.size(), count - done);
      CUBIST_RETURN_IF_ERROR(buf->CopyFromHost(host.data(), n * 2, done * 2));
    }
    return absl::OkStatus();
  };
  cubist::DeviceBuffer a, b, offsets, out;
  CUBIST_RETURN_IF_ERROR(upload_bf16(args.tokens * args.k, 1.0f, &a));
  CUBIST_RETURN_IF_ERROR(upload_bf16(args.experts * args.n * args.k, 0.02f, &b));
  std::vector<int32_t> host_offsets(args.experts + 1);
  for (int64_t e = 0; e <= args.experts; ++e) host_offsets[e] = e * f.tokens_per_expert;
  CUBIST_ASSIGN_OR_RETURN(offsets, cubist::DeviceBuffer::Allocate(
                                       driver, host_offsets.size() * sizeof(int32_t)));
  CUBIST_RETURN_IF_ERROR(
      offsets.CopyFromHost(host_offsets.data(), host_offsets.size() * sizeof(int32_t)));
  const int64_t out_cols = args.n / 2;  // SwiGLU halves N
  CUBIST_ASSIGN_OR_RETURN(out, cubist::DeviceBuffer::Allocate(driver, args.tokens * out_cols * 2));
  args.a = a.get();
  args.b = b.get();
  args.offsets = offsets.get();
  args.out = out.get();

  // --- 2. per shape, before the first step (and before graph capture) -----------
  CUBIST_RETURN_IF_ERROR(gemm->CanImplement(args));
  CUBIST_ASSIGN_OR_RETURN(const cubist::MoeGemmDecision* d, gemm->KernelFor(args));
  std::printf("kernel %s\n", d->kernel->name().c_str());

  // --- 3. every step --------------------------------------------------------------
  CUBIST_ASSIGN_OR_RETURN(cubist::Stream stream, cubist::Stream::Create(driver));
  for (int step = 0; step < 10; ++step) {
    CUBIST_RETURN_IF_ERROR(gemm->Run(args, stream.get()));
  }
  CUBIST_RETURN_IF_ERROR(stream.Synchronize());

  std::vector<uint16_t> result(args.tokens * out_cols);
  CUBIST_RETURN_IF_ERROR(out.CopyToHost(result.data(), result.size() * 2));
  double sum = 0;
  for (uint16_t v : result) {
    uint32_t u = uint32_t{v} << 16;
    float x;
    std::memcpy(&x, &u, 4);
    sum += x;
  }
  std::printf("out [%lld x %lld], checksum %.6g\n", static_cast<long long>(args.tokens),
              static_cast<long long>(out_cols), sum);
  return absl::OkStatus();
}

}  // namespace

int main(int argc, char** argv) {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  Flags f;
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    auto next = [&]() -> const char* { return i + 1 < argc ? argv[++i] : ""; };
    if (arg == "--experts") f.experts = std::atoll(next());
    else if (arg == "--tokens-per-expert") f.tokens_per_expert = std::atoll(next());
    else if (arg == "--n") f.n = std::atoll(next());
    else if (arg == "--k") f.k = std::atoll(next());
    else if (arg == "--weights") f.weights = next();
    else if (arg == "--activations") f.activations = next();
    else if (f.manifest.empty() && arg[0] != '-') f.manifest = arg;
    else {
      std::fprintf(stderr, "usage: %s MANIFEST [--experts E] [--tokens-per-expert T] "
                           "[--n N] [--k K]\n", argv[0]);
      return 2;
    }
  }
  if (f.manifest.empty()) {
    std::fprintf(stderr, "usage: %s MANIFEST [...]\n", argv[0]);
    return 2;
  }
  absl::Status s = Main(f);
  if (!s.ok()) {
    std::fprintf(stderr, "error: %s\n", std::string(s.message()).c_str());
    return 1;
  }
  return 0;
}
