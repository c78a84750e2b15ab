// The tuning file (dispatch/tuning_file.h) and the autotuning policy
// (dispatch/autotuner.h) with a fake timer.
#include <sys/wait.h>
#include <unistd.h>

#include <map>

#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "dispatch/autotuner.h"
#include "dispatch/moe_gemm.h"
#include "dispatch/tuning_file.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testlib/dispatch_manifests.h"
#include "tests/testlib/status_matchers.h"
#include "tests/testlib/temp_files.h"

namespace cubist {
namespace {

using ::cubist::testing::ParseTestManifest;
using ::cubist::testing::ReadFileOrDie;
using ::cubist::testing::SelectionKernels;
using ::cubist::testing::StatusIs;
using ::cubist::testing::TempDir;
using ::cubist::testing::WriteFileOrDie;
using ::testing::HasSubstr;

const TuningContext kH200{"NVIDIA H200", 13000, std::string(64, 'a')};

TuningRecord Rec(std::string bucket, std::string kernel, double us,
                 TuningContext ctx = kH200) {
  return TuningRecord{std::move(ctx), "moe_gemm", std::move(bucket), std::move(kernel), us, 3};
}

ShapeBucket Bucket(int64_t tpe) {
  MoeProblem p;
  p.activation = Activation::kSwiglu;
  p.experts = 128;
  p.tokens = 128 * tpe;
  p.n = 5760;
  p.k = 2880;
  return BucketOf(p);
}

TEST(ShapeBucketTest, TokensPerExpertRoundUpToPowersOfTwo) {
  EXPECT_EQ(Bucket(8).ToString(), "bf16/bf16/swiglu/e128/n5760/k2880/m8");
  EXPECT_EQ(Bucket(5).tokens_per_expert, 8);
  EXPECT_EQ(Bucket(9).tokens_per_expert, 16);
  EXPECT_EQ(Bucket(1).tokens_per_expert, 1);
  EXPECT_EQ(Bucket(0).tokens_per_expert, 0);
  EXPECT_EQ(Bucket(5), Bucket(7));
  EXPECT_NE(Bucket(8), Bucket(9));
  MoeProblem rep = RepresentativeProblem(Bucket(5), {9, 0}, 132);
  EXPECT_EQ(rep.tokens, 128 * 8);
  EXPECT_EQ(rep.sm_count, 132);
  EXPECT_EQ(BucketOf(rep), Bucket(5));
}

TEST(ShapeBucketTest, ProblemBucketAndArgsCarryEveryFieldOfTheGemmShape) {
  MoeProblem p;
  p.weight_format = DataFormat::kMxfp4;
  p.activation_format = DataFormat::kMxfp8;
  p.activation = Activation::kSitu;
  p.experts = 32;
  p.tokens = 32 * 12;
  p.n = 1536;
  p.k = 4096;
  const ShapeBucket b = BucketOf(p);
  EXPECT_EQ(b.ToString(), "mxfp4/mxfp8/situ/e32/n1536/k4096/m16");
  const MoeProblem rep = RepresentativeProblem(b, {9, 0}, 132);
  EXPECT_EQ(rep.weight_format, p.weight_format);
  EXPECT_EQ(rep.activation_format, p.activation_format);
  EXPECT_EQ(rep.activation, p.activation);
  EXPECT_EQ(rep.experts, p.experts);
  EXPECT_EQ(rep.n, p.n);
  EXPECT_EQ(rep.k, p.k);
  EXPECT_EQ(rep.tokens, 32 * 16);
  const MoeGemmArgs args = MoeGemmArgsFor(p);
  EXPECT_EQ(args.weight_format, p.weight_format);
  EXPECT_EQ(args.activation_format, p.activation_format);
  EXPECT_EQ(args.activation, p.activation);
  EXPECT_EQ(args.experts, p.experts);
  EXPECT_EQ(args.tokens, p.tokens);
  EXPECT_EQ(args.n, p.n);
  EXPECT_EQ(args.k, p.k);
}

// A routed problem's bucket is its own ("/top8of128"): timings on a router's spread of
// rows never stand in for balanced ones or the other way round. Its representative is
// routed alike, and MoeGemmArgsFor keeps the routing.
TEST(ShapeBucketTest, RoutedProblemsHaveBucketsOfTheirOwn) {
  MoeProblem p;
  p.experts = 32;
  p.tokens = 32 * 64;
  p.n = 2048;
  p.k = 768;
  const ShapeBucket balanced = BucketOf(p);
  p.routed_top_k = 8;
  p.routed_experts = 128;
  const ShapeBucket routed = BucketOf(p);
  EXPECT_NE(routed, balanced);
  EXPECT_EQ(balanced.ToString(), "bf16/bf16/identity/e32/n2048/k768/m64");
  EXPECT_EQ(routed.ToString(), "bf16/bf16/identity/e32/n2048/k768/m64/top8of128");
  const MoeProblem rep = RepresentativeProblem(routed, {9, 0}, 132);
  EXPECT_EQ(rep.routed_top_k, 8);
  EXPECT_EQ(rep.routed_experts, 128);
  EXPECT_EQ(BucketOf(rep), routed);
  const MoeGemmArgs args = MoeGemmArgsFor(p);
  EXPECT_EQ(args.routed_top_k, 8);
  EXPECT_EQ(args.routed_experts, 128);
  p.routed_experts = 0;  // the problem's own experts
  EXPECT_EQ(BucketOf(p).ToString(), "bf16/bf16/identity/e32/n2048/k768/m64/top8of32");
}

TEST(TuningFileTest, MissingFileIsEmpty) {
  TempDir dir;
  auto t = LoadTuningFile(dir.Join("none.json"), kH200);
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->size(), 0u);
}

TEST(TuningFileTest, RecordThenLoadRoundTrips) {
  TempDir dir;
  const std::string path = dir.Join("sub/tuning.json");
  ASSERT_TRUE(RecordTuning(path, Rec(Bucket(8).ToString(), "k_decode", 12.5)).ok());
  ASSERT_TRUE(RecordTuning(path, Rec(Bucket(64).ToString(), "k_prefill", 99.0)).ok());
  // Replacing an entry keeps one per key.
  ASSERT_TRUE(RecordTuning(path, Rec(Bucket(8).ToString(), "k_decode2", 11.0)).ok());
  auto t = LoadTuningFile(path, kH200);
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->size(), 2u);
  const TuningTable::Entry* e = t->Find(Op::kMoeGemm, Bucket(5));
  ASSERT_NE(e, nullptr);
  EXPECT_EQ(e->kernel, "k_decode2");
  EXPECT_DOUBLE_EQ(e->time_us, 11.0);
  EXPECT_EQ(t->Find(Op::kMoeGemm, Bucket(64))->kernel, "k_prefill");
  EXPECT_EQ(t->Find(Op::kMoeGemm, Bucket(128)), nullptr);
  nlohmann::json doc = nlohmann::json::parse(ReadFileOrDie(path));
  EXPECT_EQ(doc["schema"], "cubist.tuning/1");
  EXPECT_EQ(doc["entries"].size(), 2u);
  EXPECT_FALSE(::cubist::testing::FileExists(path + ".lock"));
}

TEST(TuningFileTest, StaleAndForeignEntriesAreIgnoredButKept) {
  TempDir dir;
  const std::string path = dir.Join("tuning.json");
  TuningContext other_gpu = kH200;
  other_gpu.gpu = "NVIDIA H100 80GB HBM3";
  TuningContext other_driver = kH200;
  other_driver.driver = 12080;
  TuningContext other_manifest = kH200;
  other_manifest.manifest = std::string(64, 'b');
  ASSERT_TRUE(RecordTuning(path, Rec(Bucket(8).ToString(), "foreign", 1, other_gpu)).ok());
  ASSERT_TRUE(RecordTuning(path, Rec(Bucket(8).ToString(), "old_drv", 2, other_driver)).ok());
  ASSERT_TRUE(RecordTuning(path, Rec(Bucket(8).ToString(), "old_set", 3, other_manifest)).ok());
  ASSERT_TRUE(RecordTuning(path, Rec(Bucket(8).ToString(), "mine", 4)).ok());
  auto t = LoadTuningFile(path, kH200);
  ASSERT_TRUE(t.ok());
  EXPECT_EQ(t->size(), 1u);
  EXPECT_EQ(t->ignored(), 3u);
  EXPECT_EQ(t->Find(Op::kMoeGemm, Bucket(8))->kernel, "mine");
  auto h100 = LoadTuningFile(path, other_gpu);
  ASSERT_TRUE(h100.ok());
  EXPECT_EQ(h100->Find(Op::kMoeGemm, Bucket(8))->kernel, "foreign");
}

TEST(TuningFileTest, MalformedEntriesAreSkipped) {
  TempDir dir;
  const std::string path = dir.Join("tuning.json");
  WriteFileOrDie(path, R"({"schema": "cubist.tuning/1", "entries": [
    {"gpu": "NVIDIA H200", "driver": "13000", "manifest": ")" + kH200.manifest +
                           R"(", "op": "moe_gemm", "bucket": "b", "kernel": "k", "time_us": 1},
    {"gpu": "NVIDIA H200", "driver": 13000, "manifest": ")" + kH200.manifest +
                           R"(", "op": "moe_gemm", "bucket": "b", "kernel": 7, "time_us": 1},
    42,
    {"gpu": "NVIDIA H200", "driver": 13000, "manifest": ")" + kH200.manifest +
                           R"(", "op": "moe_gemm", "bucket": "b", "kernel": "ok", "time_us": 2.5}
  ]})");
  auto t = LoadTuningFile(path, kH200);
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->size(), 1u);
  EXPECT_EQ(t->ignored(), 3u);
}

TEST(TuningFileTest, NotATuningFileIsAnError) {
  TempDir dir;
  const std::string path = dir.Join("tuning.json");
  WriteFileOrDie(path, "{\"schema\": \"cubist.manifest/1\"}");
  EXPECT_THAT(LoadTuningFile(path, kH200),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("tuning file " + path + ": expected \"schema\": "
                                 "\"cubist.tuning/1\"; delete it to start over")));
  WriteFileOrDie(path, "{not json");
  EXPECT_THAT(RecordTuning(path, Rec("b", "k", 1)),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("not valid JSON")));
  EXPECT_EQ(ReadFileOrDie(path), "{not json");  // left untouched
}

TEST(TuningFileTest, ConcurrentWritersFromManyProcessesLoseNothing) {
  TempDir dir;
  const std::string path = dir.Join("tuning.json");
  constexpr int kProcs = 6;
  constexpr int kEach = 15;
  std::vector<pid_t> pids;
  for (int p = 0; p < kProcs; ++p) {
    pid_t pid = fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      for (int i = 0; i < kEach; ++i) {
        TuningRecord r = Rec(absl::StrCat("p", p, "/i", i), absl::StrCat("k", p, "_", i),
                             p * 100 + i);
        if (!RecordTuning(path, r).ok()) _exit(1);
      }
      _exit(0);
    }
    pids.push_back(pid);
  }
  for (pid_t pid : pids) {
    int status = 0;
    ASSERT_EQ(waitpid(pid, &status, 0), pid);
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  }
  nlohmann::json doc = nlohmann::json::parse(ReadFileOrDie(path));
  ASSERT_EQ(doc["entries"].size(), static_cast<size_t>(kProcs * kEach));
  std::map<std::string, std::string> seen;
  for (const auto& e : doc["entries"]) seen[e["bucket"]] = e["kernel"];
  EXPECT_EQ(seen["p3/i7"], "k3_7");
  EXPECT_EQ(seen.size(), static_cast<size_t>(kProcs * kEach));
}

// Returns programmed times per kernel name; unknown names fail.
class FakeTimer : public CandidateTimer {
 public:
  explicit FakeTimer(std::map<std::string, absl::StatusOr<double>> times)
      : times_(std::move(times)) {}
  absl::StatusOr<double> TimeUs(const KernelEntry& kernel, const MoeProblem&) override {
    timed.push_back(kernel.name());
    auto it = times_.find(kernel.name());
    if (it == times_.end()) return absl::InternalError("unexpected kernel");
    return it->second;
  }
  std::vector<std::string> timed;

 private:
  std::map<std::string, absl::StatusOr<double>> times_;
};

class AutotuneTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto m = ParseTestManifest(SelectionKernels());
    ASSERT_TRUE(m.ok()) << m.status();
    auto r = Registry::Create(*m);
    ASSERT_TRUE(r.ok()) << r.status();
    registry_.emplace(std::move(*r));
    prefill_.activation = Activation::kSwiglu;
    prefill_.experts = 8;
    prefill_.tokens = 8 * 2048;
    prefill_.n = 28672;
    prefill_.k = 4096;
  }
  std::optional<Registry> registry_;
  MoeProblem prefill_;
};

TEST_F(AutotuneTest, MeasuredWinnerBeatsTheModel) {
  FakeTimer timer({{"bf16_swiglu_m128n128k64", 300.0},
                   {"bf16_swiglu_m64n128k64", 250.0},
                   {"bf16_swiglu_m64n64k64", 400.0}});
  auto r = Autotune(*registry_, prefill_, timer);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->winner->name(), "bf16_swiglu_m64n128k64");
  EXPECT_DOUBLE_EQ(r->winner_us, 250.0);
  EXPECT_EQ(timer.timed, (std::vector<std::string>{"bf16_swiglu_m128n128k64",
                                                   "bf16_swiglu_m64n128k64",
                                                   "bf16_swiglu_m64n64k64"}));
  ASSERT_EQ(r->timings.size(), 3u);
  EXPECT_EQ(r->timings[1].model_rank, 2);
  EXPECT_THAT(FormatAutotune(*r),
              HasSubstr("#2 bf16_swiglu_m64n128k64: model "));
  EXPECT_THAT(FormatAutotune(*r), HasSubstr("measured 250.0 us (winner)\n"));
}

TEST_F(AutotuneTest, TopKLimitsWhatIsTimedAndTiesKeepTheModelsChoice) {
  FakeTimer timer({{"bf16_swiglu_m128n128k64", 300.0}, {"bf16_swiglu_m64n128k64", 300.0}});
  AutotuneOptions o;
  o.top_k = 2;
  auto r = Autotune(*registry_, prefill_, timer, o);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(timer.timed.size(), 2u);
  EXPECT_EQ(r->winner->name(), "bf16_swiglu_m128n128k64");
}

// Tuning times only exact kernels unless the caller allows inexact ones: a faster kernel
// that rounds an operand ("exact": false) never becomes the tuned winner by accident.
TEST_F(AutotuneTest, InexactKernelsAreTimedOnlyWhenAllowed) {
  auto kernels = SelectionKernels();
  auto inexact =
      testing::InexactCopy(kernels, "bf16_swiglu_m128n128k64", "inexact_swiglu_m128n128k64");
  ASSERT_TRUE(inexact.has_value());
  kernels.push_back(*inexact);
  auto m = ParseTestManifest(kernels);
  ASSERT_TRUE(m.ok()) << m.status();
  auto reg = Registry::Create(*m);
  ASSERT_TRUE(reg.ok()) << reg.status();
  const std::map<std::string, absl::StatusOr<double>> times = {
      {"bf16_swiglu_m128n128k64", 300.0}, {"bf16_swiglu_m64n128k64", 250.0},
      {"bf16_swiglu_m64n64k64", 400.0}, {"inexact_swiglu_m128n128k64", 100.0}};

  FakeTimer timer(times);
  AutotuneOptions all;
  all.top_k = 10;
  auto r = Autotune(*reg, prefill_, timer, all);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->winner->name(), "bf16_swiglu_m64n128k64");
  EXPECT_EQ(timer.timed.size(), 3u);
  EXPECT_THAT(timer.timed, ::testing::Not(::testing::Contains("inexact_swiglu_m128n128k64")));

  FakeTimer allowed_timer(times);
  SelectOptions allow;
  allow.allow_inexact = true;
  r = Autotune(*reg, prefill_, allowed_timer, all, allow);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->winner->name(), "inexact_swiglu_m128n128k64");
  EXPECT_EQ(allowed_timer.timed.size(), 4u);
}

TEST_F(AutotuneTest, FailingCandidatesAreSkipped) {
  FakeTimer timer({{"bf16_swiglu_m128n128k64", absl::InternalError("launch failed")},
                   {"bf16_swiglu_m64n128k64", 260.0},
                   {"bf16_swiglu_m64n64k64", 270.0}});
  auto r = Autotune(*registry_, prefill_, timer);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->winner->name(), "bf16_swiglu_m64n128k64");
  EXPECT_THAT(FormatAutotune(*r),
              HasSubstr("#1 bf16_swiglu_m128n128k64: model "));
  EXPECT_THAT(FormatAutotune(*r),
              HasSubstr("failed: time bf16_swiglu_m128n128k64: launch failed\n"));
}

TEST_F(AutotuneTest, AllFailingIsAnError) {
  FakeTimer timer({});
  EXPECT_THAT(Autotune(*registry_, prefill_, timer),
              StatusIs(absl::StatusCode::kInternal,
                       HasSubstr("no candidate could be timed: time "
                                 "bf16_swiglu_m128n128k64: unexpected kernel")));
}

TEST_F(AutotuneTest, NoCandidateIsNotFound) {
  FakeTimer timer({});
  prefill_.activation = Activation::kGeglu;
  EXPECT_THAT(Autotune(*registry_, prefill_, timer),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("no kernel for")));
  EXPECT_TRUE(timer.timed.empty());
}

}  // namespace
}  // namespace cubist
