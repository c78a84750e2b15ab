#pragma once
#define TLLM_GEN_EXPORT_VERSION "7.0.4.0.4.0"
namespace batchedGemm {
static constexpr size_t tllmGenBatchedGemmListLen = 5;
static const batchedGemm::BatchedGemmConfig tllmGenBatchedGemmList[] = {
#ifndef EXCLUDE_SM_100
{nullptr, 0, 150528, "bmm_Bfloat16_MxE2m1Bfloat16_t128x8x256_swiGlu_sm100f", 384, "6b86b273ff34fce19d6b804eff5a3f5747ada4eaa22f1d49c01e52ddb7875b4b", "", nullptr, nullptr, nullptr, 0, { /* mClusterDimX */ 1
, /* mClusterDimY */ 1
, /* mClusterDimZ */ 1
, /* mDtypeAcc */ trtllm::gen::Dtype(1056776)
, /* mDtypeA */ trtllm::gen::Dtype(17826828)
, /* mDtypeB */ trtllm::gen::Dtype(1052672)
, /* mDtypeC */ trtllm::gen::Dtype(1052672)
, /* mEltwiseActType */ gemm::EltwiseActType(0)
, /* mKernelTraits */ {}
, /* mLayoutA */ gemm::MatrixLayout(0)
, /* mMmaM */ 128
, /* mNumStagesA */ 4
, /* mTileK */ 256
, /* mTileM */ 128
, /* mTileN */ 8
, /* mTransposeMmaOutput */ 1
, /* mUseDeepSeekFp8 */ 0
, /* mActType */ gemmGatedAct::ActType(0)
, /* mBatchMode */ batchedGemm::BatchedGemmOptions::BatchMode(1)
, /* mFusedAct */ 1
, /* mRouteSfsImpl */ {batchedGemm::RouteImpl(0)}
 }, gemm::SmVersion::Sm100f},
{nullptr, 0, 150528, "bmm_E4m3_E4m3E4m3_t128x16x128_relu2_sm103a", 384, "d4735e3a265e16eee03f59718b9b5d03019c07d8b6c51f90da3a666eec13ab35", "", nullptr, nullptr, nullptr, 0, { /* mClusterDimX */ 1
, /* mClusterDimY */ 1
, /* mClusterDimZ */ 1
, /* mDtypeAcc */ trtllm::gen::Dtype(1056776)
, /* mDtypeA */ trtllm::gen::Dtype(1050629)
, /* mDtypeB */ trtllm::gen::Dtype(1050629)
, /* mDtypeC */ trtllm::gen::Dtype(1050629)
, /* mEltwiseActType */ gemm::EltwiseActType(2)
, /* mKernelTraits */ {}
, /* mLayoutA */ gemm::MatrixLayout(0)
, /* mMmaM */ 128
, /* mNumStagesA */ 4
, /* mTileK */ 128
, /* mTileM */ 128
, /* mTileN */ 16
, /* mTransposeMmaOutput */ 1
, /* mUseDeepSeekFp8 */ 0
, /* mActType */ gemmGatedAct::ActType(2)
, /* mBatchMode */ batchedGemm::BatchedGemmOptions::BatchMode(1)
, /* mFusedAct */ 0
, /* mRouteSfsImpl */ {batchedGemm::RouteImpl(0)}
 }, gemm::SmVersion::Sm103a},
#endif // EXCLUDE_SM_100
};
}
