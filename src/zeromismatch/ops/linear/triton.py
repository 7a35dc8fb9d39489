"""The CUDA batch-invariant GEMM for `linear` (y = x @ W^T): Triton, fixed K order, no split-K.

Every output element is one dot product accumulated over K in BLOCK_K pieces, in order, into an fp32
accumulator; rows never interact, and M is not specialized, so a row's bits cannot depend on how many rows
share the call *for a given tile config*. The gemm policy (conf/numerics `gemm_policy`) chooses the config:

- "fixed": the config is a function of (N, K, dtype) only. Invariance follows from the above alone.
- "adaptive" (default): the config also depends on M (small tiles for decode, large for training). This is
  invariant only if the bits do not depend on the tile shape / num_warps / TMA-vs-pointer loads (one wgmma k16
  chain over K in order, fp32 accumulator). Measured on the H200 (results/gpu/README.md): every config gave
  the same bits, at every shape tried.
- "hybrid" (opt-in): bf16 GEMMs with M >= HYBRID_MIN_M go to cuBLASLt with its
  workspace starved (`ops.device.enable_cublaslt_invariant()` before CUDA starts; no split-K), smaller M to the
  Triton kernels. Valid because cuBLASLt's bits equal ours (measured: 100% of elements at every shape tried,
  and end-to-end parity under this policy). fp32 stays on Triton: cuBLASLt's fp32 GEMM is not invariant.
  Without that cuBLASLt setup the policy falls back to "adaptive". (The adaptive policy's persistent kernel
  already runs at cuBLAS speed at training shapes, so this is an alternative, not a requirement.)

bf16 inputs use the tensor cores (wgmma on Hopper: BLOCK_M >= 64, num_warps a multiple of 4), with a bf16 output
or, for the lm_head (head.py), the fp32 accumulator itself; fp32 inputs use input_precision="ieee" (FMA,
sequential over K: config independent by construction).
Differentiable: the backward is plain torch (it need not be invariant).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, replace

import torch
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

from ..device import configure_cuda, num_sms
from .autograd import linear_with
from .policy import DEFAULT_GEMM_POLICY

HYBRID_MIN_M = 1024  # the hybrid policy's smallest row count sent to cuBLASLt
BLOCK_K_BF16 = 64
BLOCK_K_FP32 = 32
# shared memory a TMA config may take, as measured to compile and run on the H200 (results/gpu/tensor_core_head_11c70f0):
# 200 KB (d64 and d32 with bf16 outputs, d64 at 5 stages with an fp32 one), 208 KB for the persistent kernel (p256 at
# 3 stages with its fp32 epilogue in halves, 147456 + 65536 bytes, at cuBLAS's speed; 2 stages: 1.27x slower)
SMEM_BUDGET = 200 * 1024
SMEM_BUDGET_PERSISTENT = 208 * 1024


@dataclass(frozen=True)
class Cfg:
    bm: int
    bn: int
    bk: int
    warps: int
    stages: int
    group_m: int = 8
    tma: bool = False
    persistent: bool = False  # TMA only: one program per SM looping over tiles
    swap: bool = False  # TMA only: y^T = W x^T (W rows on the MMA's M side; for few tokens)
    epi_split: bool = False  # persistent only: store the tile in two halves
    ws: bool = False  # persistent only: tl.range(warp_specialize=True)
    prec: str = "ieee"  # fp32 inputs only: the dot's input_precision (ieee: FMA chains; tf32x3: experiments)


# named configs (tests/gpu: every one gives the same bits; benchmarks/gemm.py times some); BLOCK_K fixed per dtype
CONFIGS = {
    "s16": Cfg(64, 16, BLOCK_K_BF16, 4, 6),
    "s32": Cfg(64, 32, BLOCK_K_BF16, 4, 6),
    "s64": Cfg(64, 64, BLOCK_K_BF16, 4, 5),
    "m128": Cfg(128, 128, BLOCK_K_BF16, 8, 4),
    "l256": Cfg(128, 256, BLOCK_K_BF16, 8, 3),
    "s32_tma": Cfg(64, 32, BLOCK_K_BF16, 4, 6, tma=True),
    "s64_tma": Cfg(64, 64, BLOCK_K_BF16, 4, 5, tma=True),
    "m128_tma": Cfg(128, 128, BLOCK_K_BF16, 8, 4, tma=True),
    "l256_tma": Cfg(128, 256, BLOCK_K_BF16, 8, 3, tma=True),
    # measured on the H200 (results/gpu): persistent TMA 128x256 is at cuBLAS speed for training shapes;
    # decode shapes want narrow N tiles, BLOCK_K 128 and deep pipelines (bytes in flight); same bits as all others
    "p256": Cfg(128, 256, BLOCK_K_BF16, 8, 3, tma=True, persistent=True),
    "d32": Cfg(64, 32, 2 * BLOCK_K_BF16, 4, 8, tma=True),
    "d64": Cfg(64, 64, 2 * BLOCK_K_BF16, 4, 6, tma=True),
    # candidates for the fp32-output lm_head in decode (M <= 16): 16-row tiles (mma.sync, same bits as wgmma's)
    # stage less shared memory, so more programs stream the weight per SM
    "d16": Cfg(16, 64, 2 * BLOCK_K_BF16, 4, 6, tma=True),
    "d16w": Cfg(16, 128, 2 * BLOCK_K_BF16, 4, 5, tma=True),
    # decode, persistent: one program per SM walks narrow N tiles with its pipeline running on from one tile into
    # the next, so N / BN tiles need not fill whole waves (M = 1: 4096 / 64 = 64 programs on 132 SMs)
    "pd32": Cfg(64, 32, 2 * BLOCK_K_BF16, 4, 8, tma=True, persistent=True),
    "pd16": Cfg(16, 32, 2 * BLOCK_K_BF16, 4, 8, tma=True, persistent=True),
    "f32": Cfg(64, 64, BLOCK_K_FP32, 4, 3),
    "f32_s": Cfg(32, 64, BLOCK_K_FP32, 4, 3),
    "f32_l": Cfg(128, 128, BLOCK_K_FP32, 8, 3),
    "f32_m": Cfg(128, 64, BLOCK_K_FP32, 8, 3),
    # decode rows (M <= 16): a 16-row tile does a quarter of f32's FMAs on padding rows; at the fp32 lm_head's
    # decode shape (M = 1, K = 4096, N = 248320) f32's 64-row tile makes the FMAs, not the weight bytes, the cost
    "f32_d": Cfg(16, 64, BLOCK_K_FP32, 4, 4),
}


def _tma_ok(x: torch.Tensor, w: torch.Tensor, n: int) -> bool:
    es = x.element_size()
    return (
        x.dtype == torch.bfloat16
        and x.stride(-1) == 1
        and w.stride(-1) == 1
        and (x.stride(0) * es) % 16 == 0
        and (w.stride(0) * es) % 16 == 0
        and (n * es) % 16 == 0
        and x.data_ptr() % 16 == 0
        and w.data_ptr() % 16 == 0
    )


def pick(m: int, n: int, k: int, dtype: torch.dtype, tma_ok: bool, policy: str = DEFAULT_GEMM_POLICY) -> str:
    if policy == "hybrid":
        policy = "adaptive"
    if dtype == torch.float32:  # ieee FMA chains: every config the same bits by construction
        return "f32_d" if policy != "fixed" and m <= 16 else "f32"
    if policy == "fixed":
        name = "m128" if n >= 128 else ("s64" if n > 32 else ("s32" if n > 16 else "s16"))
        # pointer loads whatever the shape: the path must not depend on M either
        return name
    # adaptive: decode shapes take narrow tiles (more CTAs streaming W), training shapes wide persistent ones
    if not tma_ok:
        return ("s32" if n >= 2048 else "s16") if m <= 64 else ("s64" if m <= 512 else "m128")
    # picks from the CUDA-graph-timed decode sweeps (results/gpu/README.md, ratios to cuBLAS): M <= 16: pd16 (0.98-1.03;
    # d64 1.21-1.39, results/gpu/decode_settings_8284320); M = 32: d64; M = 64: d32 for narrow N (0.92-1.0), s64_tma
    # for N >= 12288 (0.95-0.99); M = 256: s64_tma (1.20-1.55)
    if m <= 16:
        return "pd16"
    if m <= 32:
        return "d64"
    if m <= 64:
        return "d32" if n < 64 * 132 else "s64_tma"
    if m <= 512:
        return "s64_tma"
    return "p256" if n >= 256 else "m128_tma"


@triton.jit
def _tile_ids(pid, M, N, BM: tl.constexpr, BN: tl.constexpr, GROUP_M: tl.constexpr):
    num_pid_m = tl.cdiv(M, BM)
    num_pid_n = tl.cdiv(N, BN)
    width = GROUP_M * num_pid_n
    group = pid // width
    first_m = group * GROUP_M
    size_m = tl.minimum(num_pid_m - first_m, GROUP_M)
    pid_m = first_m + ((pid % width) % size_m)
    pid_n = (pid % width) // size_m
    return pid_m, pid_n


@triton.jit(do_not_specialize=["M", "stride_xm", "stride_ym"])
def _linear_ptr_kernel(x_ptr, w_ptr, y_ptr, M, N, K, stride_xm, stride_wn, stride_ym,
                       BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, GROUP_M: tl.constexpr,
                       PREC: tl.constexpr):
    pid = tl.program_id(0)
    pid_m, pid_n = _tile_ids(pid, M, N, BM, BN, GROUP_M)
    offs_m = pid_m * BM + tl.arange(0, BM)
    offs_n = pid_n * BN + tl.arange(0, BN)
    offs_k = tl.arange(0, BK)
    x_ptrs = x_ptr + offs_m.to(tl.int64)[:, None] * stride_xm + offs_k[None, :]
    w_ptrs = w_ptr + offs_n.to(tl.int64)[None, :] * stride_wn + offs_k[:, None]
    mmask = offs_m[:, None] < M
    nmask = offs_n[None, :] < N
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    for kt in range(0, tl.cdiv(K, BK)):
        krem = K - kt * BK
        a = tl.load(x_ptrs, mask=mmask & (offs_k[None, :] < krem), other=0.0)
        b = tl.load(w_ptrs, mask=(offs_k[:, None] < krem) & nmask, other=0.0)
        if PREC == "":
            acc = tl.dot(a, b, acc)
        else:
            acc = tl.dot(a, b, acc, input_precision=PREC)
        x_ptrs += BK
        w_ptrs += BK
    y_ptrs = y_ptr + offs_m.to(tl.int64)[:, None] * stride_ym + offs_n[None, :]
    tl.store(y_ptrs, acc.to(y_ptr.dtype.element_ty), mask=mmask & nmask)


@triton.jit(do_not_specialize=["M"])
def _linear_tma_persistent_kernel(x_desc, w_desc, y_desc, M, N, K,
                                  BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, GROUP_M: tl.constexpr,
                                  NUM_SMS: tl.constexpr, EPI_SPLIT: tl.constexpr, WS: tl.constexpr):
    start = tl.program_id(0)
    num_tiles = tl.cdiv(M, BM) * tl.cdiv(N, BN)
    k_tiles = tl.cdiv(K, BK)
    for tile in tl.range(start, num_tiles, NUM_SMS, flatten=True, warp_specialize=WS):
        pid_m, pid_n = _tile_ids(tile, M, N, BM, BN, GROUP_M)
        off_m = pid_m * BM
        off_n = pid_n * BN
        acc = tl.zeros((BM, BN), dtype=tl.float32)
        for kt in range(k_tiles):
            a = x_desc.load([off_m, kt * BK])
            b = w_desc.load([off_n, kt * BK])
            acc = tl.dot(a, b.T, acc)
        if EPI_SPLIT:
            acc = tl.reshape(acc, (BM, 2, BN // 2))
            acc = tl.permute(acc, (0, 2, 1))
            c0, c1 = tl.split(acc)
            y_desc.store([off_m, off_n], c0.to(y_desc.dtype))
            y_desc.store([off_m, off_n + BN // 2], c1.to(y_desc.dtype))
        else:
            y_desc.store([off_m, off_n], acc.to(y_desc.dtype))


@triton.jit(do_not_specialize=["M"])
def _linear_tma_swap_kernel(x_desc, w_desc, y_desc, M, N, K,
                            BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr):
    """BN rows of W (MMA M side, >= 64) x BM tokens (MMA N side): acc[BN, BM] = W_tile @ x_tile^T."""
    pid_n = tl.program_id(0)
    pid_m = tl.program_id(1)
    off_n = pid_n * BN
    off_m = pid_m * BM
    acc = tl.zeros((BN, BM), dtype=tl.float32)
    for kt in range(0, tl.cdiv(K, BK)):
        w = w_desc.load([off_n, kt * BK])
        x = x_desc.load([off_m, kt * BK])
        acc = tl.dot(w, x.T, acc)
    y_desc.store([off_m, off_n], tl.trans(acc).to(y_desc.dtype))


@triton.jit(do_not_specialize=["M"])
def _linear_tma_kernel(x_desc, w_desc, y_desc, M, N, K,
                       BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, GROUP_M: tl.constexpr):
    pid = tl.program_id(0)
    pid_m, pid_n = _tile_ids(pid, M, N, BM, BN, GROUP_M)
    off_m = pid_m * BM
    off_n = pid_n * BN
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    for kt in range(0, tl.cdiv(K, BK)):
        a = x_desc.load([off_m, kt * BK])
        b = w_desc.load([off_n, kt * BK])
        acc = tl.dot(a, b.T, acc)
    y_desc.store([off_m, off_n], acc.to(y_desc.dtype))


def cublaslt_invariant_ready() -> bool:
    """cuBLASLt preferred with a starved workspace (see ops.device.enable_cublaslt_invariant)."""
    return (
        os.environ.get("CUBLASLT_WORKSPACE_SIZE") == "1"
        and str(torch.backends.cuda.preferred_blas_library()).lower().endswith("cublaslt")
    )


def fit_smem(c: Cfg, out_dtype: torch.dtype) -> Cfg:
    """A TMA config with an output wider than its inputs (bf16 x bf16 -> fp32 logits): the epilogue stages the
    output tile in shared memory, so the persistent kernel stores it in halves and the pipeline drops stages until
    the total fits the budget. Same bits: stages and epilogue never change a dot's K order."""
    if not c.tma or out_dtype.itemsize <= 2:
        return c
    if c.persistent:
        c = replace(c, epi_split=True)
    def smem(cfg):
        tile = cfg.bm * (cfg.bn // 2 if cfg.epi_split else cfg.bn) * out_dtype.itemsize
        return cfg.stages * (cfg.bm + cfg.bn) * cfg.bk * 2 + tile
    budget = SMEM_BUDGET_PERSISTENT if c.persistent else SMEM_BUDGET
    while c.stages > 1 and smem(c) > budget:
        c = replace(c, stages=c.stages - 1)
    return c


def linear_raw(x2: torch.Tensor, w: torch.Tensor, cfg_name: str | Cfg | None = None,
               policy: str = DEFAULT_GEMM_POLICY, out_dtype: torch.dtype | None = None) -> torch.Tensor:
    """x2 [M, K], w [N, K] (same dtype: bf16 or fp32) -> [M, N] in that dtype, or in out_dtype (fp32 for the lm_head:
    the fp32 accumulator stored unrounded). cfg_name: a CONFIGS name or a Cfg (experiments); default: chosen by the
    policy."""
    configure_cuda()
    out_dtype = out_dtype or x2.dtype
    # (bf16 only: cuBLASLt's fp32 GEMM is not batch-invariant even with the workspace starved, measured; an fp32
    # output from bf16 inputs was never measured against ours, so it stays on Triton)
    if (cfg_name is None and policy == "hybrid" and x2.is_cuda and x2.dtype == torch.bfloat16
            and out_dtype == x2.dtype and x2.shape[0] >= HYBRID_MIN_M and cublaslt_invariant_ready()):
        return torch.mm(x2, w.t())
    assert x2.dtype == w.dtype and x2.dtype in (torch.bfloat16, torch.float16, torch.float32), (x2.dtype, w.dtype)
    assert out_dtype in (x2.dtype, torch.float32), (x2.dtype, out_dtype)
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    if w.stride(-1) != 1:
        w = w.contiguous()
    m, k = x2.shape
    n = w.shape[0]
    y = torch.empty(m, n, device=x2.device, dtype=out_dtype)
    if m == 0:
        return y
    tma_ok = _tma_ok(x2, w, n)
    if isinstance(cfg_name, Cfg):
        c = cfg_name
    else:
        c = fit_smem(CONFIGS[cfg_name or pick(m, n, k, x2.dtype, tma_ok, policy)], out_dtype)
    grid = (triton.cdiv(m, c.bm) * triton.cdiv(n, c.bn),)
    if c.tma and c.swap:
        xd = TensorDescriptor.from_tensor(x2, [c.bm, c.bk])
        wd = TensorDescriptor.from_tensor(w, [c.bn, c.bk])
        yd = TensorDescriptor.from_tensor(y, [c.bm, c.bn])
        _linear_tma_swap_kernel[(triton.cdiv(n, c.bn), triton.cdiv(m, c.bm))](
            xd, wd, yd, m, n, k, BM=c.bm, BN=c.bn, BK=c.bk, num_warps=c.warps, num_stages=c.stages)
    elif c.tma and c.persistent:
        sms = num_sms(x2.device)
        xd = TensorDescriptor.from_tensor(x2, [c.bm, c.bk])
        wd = TensorDescriptor.from_tensor(w, [c.bn, c.bk])
        yd = TensorDescriptor.from_tensor(y, [c.bm, c.bn // 2 if c.epi_split else c.bn])
        _linear_tma_persistent_kernel[(min(sms, grid[0]),)](
            xd, wd, yd, m, n, k, BM=c.bm, BN=c.bn, BK=c.bk, GROUP_M=c.group_m, NUM_SMS=sms,
            EPI_SPLIT=c.epi_split, WS=c.ws, num_warps=c.warps, num_stages=c.stages)
    elif c.tma:
        xd = TensorDescriptor.from_tensor(x2, [c.bm, c.bk])
        wd = TensorDescriptor.from_tensor(w, [c.bn, c.bk])
        yd = TensorDescriptor.from_tensor(y, [c.bm, c.bn])
        _linear_tma_kernel[grid](xd, wd, yd, m, n, k, BM=c.bm, BN=c.bn, BK=c.bk, GROUP_M=c.group_m,
                                 num_warps=c.warps, num_stages=c.stages)
    else:
        _linear_ptr_kernel[grid](x2, w, y, m, n, k, x2.stride(0), w.stride(0), y.stride(0),
                                 BM=c.bm, BN=c.bn, BK=c.bk, GROUP_M=c.group_m,
                                 PREC=c.prec if x2.dtype == torch.float32 else "",
                                 num_warps=c.warps, num_stages=c.stages)
    return y


def linear(x: torch.Tensor, weight: torch.Tensor, policy: str = DEFAULT_GEMM_POLICY) -> torch.Tensor:
    """x [..., K] @ weight[N, K]^T, batch-invariant on CUDA, tile config by `policy`."""
    return linear_with(lambda x2, w: linear_raw(x2, w, policy=policy), x, weight)
