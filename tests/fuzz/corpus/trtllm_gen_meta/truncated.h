#pragma once
#define TLLM_GEN_EXPORT_VERSION "7.0.4.0.4.0"
namespace batchedGemm {
static constexpr size_t tllmGenBatchedGemmListLen = 2;
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
, /* mTransposeMmaOutput */