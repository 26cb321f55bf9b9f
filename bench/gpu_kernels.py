"""Time the kernels of a decoder step on a CUDA GPU with torch alone (no serving engine), for the step-time model.

What it measures, each with CUDA events around a captured CUDA graph (so launch overhead is not counted, as in an
engine that replays graphs), writing one JSON file:

- ``bandwidth``: device-to-device copy and a read-only reduction over a few GiB (the reachable HBM bandwidth);
- ``block_linear``: a transformer block's linear part (two RMS norms, fused QKV projection, output projection,
  fused gate+up projection, SiLU-and-multiply, down projection, two residual adds; the operations Vidur's
  ``mlp.csv`` files sum) for model shapes and tensor-parallel shards, at token counts 1..8192, in bf16 and, where
  the GPU has FP8 tensor cores, in FP8 (``torch._scaled_mm``, per-tensor scales);
- ``attention_decode``: one layer of decode attention (one query token per sequence over a contiguous KV cache,
  ``scaled_dot_product_attention``; the fastest backend that runs) by batch and context;
- ``attention_prefill``: one layer of causal prefill attention by prompt length;
- ``decode_step``: a whole Llama-3.1-8B-shaped decode step (32 blocks with their own weights, attention over a
  KV cache, the LM head) by batch at two contexts, bf16;
- ``prefill_step``: the same model's forward over one prompt of T tokens;
- ``mixed_steps``: the step a chunked-prefill engine runs, B decoding sequences and a prefill chunk of P tokens in
  one forward (the GEMMs over B + P tokens at once, each part's attention apart), beside the same B alone: what a
  prefill chunk costs the decodes that share its step (the interference prefill/decode disaggregation removes).

Weights are random (timing does not depend on values). Several copies of small weights are cycled so that the L2
cache does not serve a repeated read. Run: ``python bench/gpu_kernels.py --out DIR [--budget-s 300] [--sections a,b]``; sections
past the time budget are skipped and said so. ``--dry-run`` checks the script on a CPU with tiny shapes.
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

#: (name, hidden, intermediate, heads, kv heads) of the blocks timed, then the TP degrees of their shards
SHAPES = {
    "llama-3.1-8b": (4096, 14336, 32, 8, (1, 2, 4)),
    "llama-2-7b": (4096, 11008, 32, 32, (1, 2)),
    "llama-2-70b": (8192, 28672, 64, 8, (2, 4, 8)),
    "codellama-34b": (8192, 22016, 64, 8, (1, 2, 4)),
    "mistral-nemo-12b": (5120, 14336, 32, 8, (1, 2)),
    "qwen2.5-7b": (3584, 18944, 28, 4, (1,)),
}
TOKENS = (1, 2, 4, 8, 16, 32, 64, 96, 128, 192, 256, 384, 512, 1024, 2048, 4096, 8192)
HEAD_DIM = 128


class Clock:
    def __init__(self, budget_s: float):
        self.t0 = time.monotonic()
        self.budget_s = budget_s

    def left_s(self) -> float:
        return self.budget_s - (time.monotonic() - self.t0)


def _sync(dev: str) -> None:
    if dev == "cuda":
        torch.cuda.synchronize()


def time_fn(fn, dev: str, reps: int = 20, graph: bool = True) -> float:
    """Median seconds of one call of ``fn``: on CUDA, ``reps`` calls captured in a graph, replayed 5 times."""
    if dev != "cuda":
        fn()
        t = []
        for _ in range(3):
            t0 = time.perf_counter()
            fn()
            t.append(time.perf_counter() - t0)
        return sorted(t)[1]
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    if graph:
        try:
            s = torch.cuda.Stream()
            s.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(s):
                fn()
            torch.cuda.current_stream().wait_stream(s)
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g):
                for _ in range(reps):
                    fn()
            g.replay()
            torch.cuda.synchronize()
            times = []
            for _ in range(5):
                a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                a.record()
                g.replay()
                b.record()
                b.synchronize()
                times.append(a.elapsed_time(b) * 1e-3 / reps)
            del g
            return sorted(times)[2]
        except Exception as exc:  # a kernel that cannot be captured: time it eagerly
            print(f"  graph capture failed ({type(exc).__name__}: {exc}); timing eagerly", file=sys.stderr)
    times = []
    for _ in range(5):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        for _ in range(reps):
            fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) * 1e-3 / reps)
    return sorted(times)[2]


def rms_norm(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    v = x.float().pow(2).mean(-1, keepdim=True)
    return (x.float() * torch.rsqrt(v + 1e-6)).to(x.dtype) * w


class Linear:
    """y = x @ W^T in bf16, or in FP8 with per-tensor scales (``torch._scaled_mm``)."""

    def __init__(self, n_in: int, n_out: int, dtype: str, dev: str):
        self.fp8 = dtype == "fp8"
        w = torch.randn(n_out, n_in, device=dev, dtype=torch.bfloat16) * 0.02
        if self.fp8:
            self.w = w.to(torch.float8_e4m3fn).t()  # column-major, as _scaled_mm wants the second operand
            self.scale = torch.tensor(1.0, device=dev)
        else:
            self.w = w

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self.fp8:
            xq = x.to(torch.float8_e4m3fn)
            y = torch._scaled_mm(xq, self.w, scale_a=self.scale, scale_b=self.scale, out_dtype=torch.bfloat16)
            return y[0] if isinstance(y, tuple) else y  # older torch returned (out, amax)
        return x @ self.w.t()


class Block:
    """The linear part of one decoder block (one tensor-parallel shard)."""

    def __init__(self, hidden: int, inter: int, heads: int, kv_heads: int, tp: int, dtype: str, dev: str):
        qkv = (heads + 2 * kv_heads) * HEAD_DIM // tp
        self.heads, self.kv_heads, self.tp = heads // tp, max(1, kv_heads // tp), tp
        self.qkv = Linear(hidden, qkv, dtype, dev)
        self.o = Linear(heads * HEAD_DIM // tp, hidden, dtype, dev)
        self.gate_up = Linear(hidden, 2 * inter // tp, dtype, dev)
        self.down = Linear(inter // tp, hidden, dtype, dev)
        self.n1 = torch.ones(hidden, device=dev, dtype=torch.bfloat16)
        self.n2 = torch.ones(hidden, device=dev, dtype=torch.bfloat16)
        self.inter = inter // tp

    def linear(self, x: torch.Tensor) -> torch.Tensor:
        h = rms_norm(x, self.n1)
        qkv = self.qkv(h)
        attn_out = qkv[:, : self.heads * HEAD_DIM]
        x = x + self.o(attn_out.contiguous())
        h = rms_norm(x, self.n2)
        gu = self.gate_up(h)
        a = F.silu(gu[:, : self.inter]) * gu[:, self.inter:]
        return x + self.down(a)

    def gemms(self, x: torch.Tensor) -> None:
        """The four projections alone (no norms, activation or adds), shapes as in :meth:`linear`."""
        qkv = self.qkv(x)
        self.o(qkv[:, : self.heads * HEAD_DIM].contiguous())
        gu = self.gate_up(x)
        self.down(gu[:, : self.inter].contiguous())

    def weight_bytes(self) -> int:
        return sum(lin.w.numel() * lin.w.element_size() for lin in (self.qkv, self.o, self.gate_up, self.down))


def section_bandwidth(dev: str, dry: bool) -> dict:
    n = (64 if dry else 2048) * 1024 * 1024 // 2  # elements of bf16
    a = torch.empty(n, device=dev, dtype=torch.bfloat16).uniform_()
    b = torch.empty_like(a)
    copy_s = time_fn(lambda: b.copy_(a), dev, reps=5)
    read_s = time_fn(lambda: a.sum(dtype=torch.float32), dev, reps=5)
    nbytes = n * 2
    out = {"bytes": nbytes, "copy_s": copy_s, "copy_bytes_s": 2 * nbytes / copy_s,
           "read_s": read_s, "read_bytes_s": nbytes / read_s}
    if dev == "cuda":  # the host link (CPU KV offload, P/D staging): pinned host memory <-> device, 256 MiB
        host = torch.empty(128 * 1024 * 1024, dtype=torch.bfloat16, pin_memory=True)
        d = torch.empty(host.shape, device=dev, dtype=torch.bfloat16)
        for name, fn in (("h2d", lambda: d.copy_(host, non_blocking=True)),
                         ("d2h", lambda: host.copy_(d, non_blocking=True))):
            s = time_fn(fn, dev, reps=5, graph=False)
            out[f"{name}_s"], out[f"{name}_bytes_s"] = s, host.numel() * 2 / s
    return out


def section_block_linear(dev: str, dry: bool, clock: Clock, dtypes: tuple[str, ...]) -> list[dict]:
    out = []
    shapes = {"tiny": (256, 512, 4, 2, (1,))} if dry else SHAPES
    tokens = (1, 8, 64) if dry else TOKENS
    for dtype in dtypes:
        for name, (h, inter, heads, kvh, tps) in shapes.items():
            if dtype == "fp8" and name not in ("llama-3.1-8b", "llama-2-70b"):
                continue
            for tp in tps:
                if clock.left_s() < 60:
                    out.append({"skipped": f"{name} TP {tp} {dtype}: time budget"})
                    continue
                # cycle copies so that at least ~400 MB of weights are read between reuses (L2 is tens of MB)
                one = Block(h, inter, heads, kvh, tp, dtype, dev)
                wb = one.weight_bytes()
                copies = [one] + [Block(h, inter, heads, kvh, tp, dtype, dev)
                                  for _ in range(max(0, min(4, math.ceil(2e8 / wb)) - 1))]
                row = {"model": name, "tp": tp, "dtype": dtype, "hidden_size": h, "intermediate_size": inter,
                       "num_heads": heads, "num_kv_heads": kvh, "weight_bytes_per_gpu": wb, "copies": len(copies),
                       "num_tokens": [], "block_s": [], "gemm_s": []}
                for t in tokens:
                    if dtype == "fp8" and t % 16:
                        continue  # _scaled_mm wants dimensions divisible by 16
                    x = torch.randn(t, h, device=dev, dtype=torch.bfloat16)

                    def run(x=x):
                        for blk in copies:
                            blk.linear(x)
                    s = time_fn(run, dev, reps=4) / len(copies)

                    def run_gemms(x=x):
                        for blk in copies:
                            blk.gemms(x)
                    row["num_tokens"].append(t)
                    row["block_s"].append(s)
                    row["gemm_s"].append(time_fn(run_gemms, dev, reps=4) / len(copies))
                del copies, one
                if dev == "cuda":
                    torch.cuda.empty_cache()
                print(f"  block_linear {name} TP {tp} {dtype}: 1 tok {row['block_s'][0] * 1e6:.1f} us, "
                      f"{row['num_tokens'][-1]} tok {row['block_s'][-1] * 1e3:.3f} ms", flush=True)
                out.append(row)
    return out


def _sdpa(q, k, v, causal: bool) -> torch.Tensor:
    if q.shape[1] == k.shape[1]:
        return F.scaled_dot_product_attention(q, k, v, is_causal=causal)
    try:
        return F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=True)
    except TypeError:  # a torch without enable_gqa: repeat the KV heads
        r = q.shape[1] // k.shape[1]
        return F.scaled_dot_product_attention(q, k.repeat_interleave(r, 1), v.repeat_interleave(r, 1),
                                              is_causal=causal)


def _best_backend_time(fn_for, dev: str) -> tuple[float, str]:
    if dev != "cuda":
        return time_fn(fn_for(None), dev), "math"
    try:
        from torch.nn.attention import SDPBackend, sdpa_kernel
    except ImportError:  # an older torch: the default backend only
        return time_fn(fn_for(None), dev, reps=10), "default"
    best = (math.inf, "")
    for be in (SDPBackend.FLASH_ATTENTION, SDPBackend.CUDNN_ATTENTION, SDPBackend.EFFICIENT_ATTENTION):
        try:
            with sdpa_kernel(be):
                s = time_fn(fn_for(be), dev, reps=10)
            if s < best[0]:
                best = (s, be.name)
        except Exception as exc:
            print(f"  {be.name}: {type(exc).__name__}", file=sys.stderr)
    return best


def section_attention_decode(dev: str, dry: bool, clock: Clock) -> list[dict]:
    out = []
    configs = {"gqa-32q-8kv": (32, 8), "mha-32": (32, 32)} if not dry else {"tiny": (4, 2)}
    for name, (hq, hkv) in configs.items():
        for b in ((1, 8, 32, 64, 128, 256) if not dry else (1, 4)):
            for ctx in ((256, 1024, 2048, 4096) if not dry else (64,)):
                if clock.left_s() < 45:
                    out.append({"skipped": f"{name} B {b} ctx {ctx}: time budget"})
                    continue
                kv_bytes = 2 * b * hkv * ctx * HEAD_DIM * 2
                if kv_bytes > 40e9:
                    continue
                q = torch.randn(b, hq, 1, HEAD_DIM, device=dev, dtype=torch.bfloat16)
                k = torch.randn(b, hkv, ctx, HEAD_DIM, device=dev, dtype=torch.bfloat16)
                v = torch.randn_like(k)

                def fn_for(_be, q=q, k=k, v=v):
                    return lambda: _sdpa(q, k, v, False)
                with torch.no_grad():
                    s, be = _best_backend_time(fn_for, dev)
                out.append({"config": name, "num_heads": hq, "num_kv_heads": hkv, "batch": b, "context_tokens": ctx,
                            "kv_bytes": kv_bytes, "layer_s": s, "backend": be,
                            "kv_bytes_s": kv_bytes / s if s > 0 else None})
                del q, k, v
        print(f"  attention_decode {name}: done", flush=True)
    return out


def section_attention_prefill(dev: str, dry: bool, clock: Clock) -> list[dict]:
    out = []
    for hq, hkv in ((32, 8),) if not dry else ((4, 2),):
        for n in ((256, 512, 1024, 2048, 4096, 8192) if not dry else (64,)):
            if clock.left_s() < 40:
                out.append({"skipped": f"prefill attention {n}: time budget"})
                continue
            q = torch.randn(1, hq, n, HEAD_DIM, device=dev, dtype=torch.bfloat16)
            k = torch.randn(1, hkv, n, HEAD_DIM, device=dev, dtype=torch.bfloat16)
            v = torch.randn_like(k)

            def fn_for(_be, q=q, k=k, v=v):
                return lambda: _sdpa(q, k, v, True)
            with torch.no_grad():
                s, be = _best_backend_time(fn_for, dev)
            flops = 4.0 * hq * HEAD_DIM * n * (n + 1) / 2  # causal: QK^T and PV over the lower triangle
            out.append({"num_heads": hq, "num_kv_heads": hkv, "prompt_tokens": n, "layer_s": s, "backend": be,
                        "flops": flops, "flops_s": flops / s if s > 0 else None})
    return out


class Model:
    """A Llama-3.1-8B-shaped stack (random weights) with a contiguous KV cache, for whole-step timings."""

    def __init__(self, dev: str, dry: bool, batch: int, ctx: int):
        h, inter, hq, hkv, layers, vocab = (4096, 14336, 32, 8, 32, 128256) if not dry else (256, 512, 4, 2, 2, 1000)
        self.blocks = [Block(h, inter, hq, hkv, 1, "bf16", dev) for _ in range(layers)]
        self.lm_head = torch.randn(vocab, h, device=dev, dtype=torch.bfloat16) * 0.02
        self.hq, self.hkv, self.h = hq, hkv, h
        self.k = [torch.randn(batch, hkv, ctx, HEAD_DIM, device=dev, dtype=torch.bfloat16) for _ in range(layers)]
        self.v = [torch.randn_like(k) for k in self.k]

    def decode(self, x: torch.Tensor) -> torch.Tensor:
        b = x.shape[0]
        for blk, k, v in zip(self.blocks, self.k, self.v):
            h = rms_norm(x, blk.n1)
            qkv = blk.qkv(h)
            q = qkv[:, : self.hq * HEAD_DIM].view(b, self.hq, 1, HEAD_DIM)
            a = _sdpa(q, k, v, False).reshape(b, self.hq * HEAD_DIM)
            x = x + blk.o(a)
            h = rms_norm(x, blk.n2)
            gu = blk.gate_up(h)
            x = x + blk.down(F.silu(gu[:, : blk.inter]) * gu[:, blk.inter:])
        return rms_norm(x, self.blocks[0].n1) @ self.lm_head.t()

    def mixed(self, xd: torch.Tensor, xp: torch.Tensor) -> torch.Tensor:
        """One chunked-prefill step: ``xd`` (B decode tokens, KV cache of the model's context) and ``xp`` (a
        P-token prefill chunk) share every GEMM; attention runs per part."""
        b, n = xd.shape[0], xp.shape[0]
        x = torch.cat([xd, xp])
        for blk, k, v in zip(self.blocks, self.k, self.v):
            qkv = blk.qkv(rms_norm(x, blk.n1))
            qd = qkv[:b, : self.hq * HEAD_DIM].view(b, self.hq, 1, HEAD_DIM)
            ad = _sdpa(qd, k, v, False).reshape(b, self.hq * HEAD_DIM)
            qp = qkv[b:, : self.hq * HEAD_DIM].view(n, self.hq, HEAD_DIM).transpose(0, 1).unsqueeze(0)
            kp = qkv[b:, self.hq * HEAD_DIM:(self.hq + self.hkv) * HEAD_DIM].view(n, self.hkv, HEAD_DIM)
            vp = qkv[b:, (self.hq + self.hkv) * HEAD_DIM:].view(n, self.hkv, HEAD_DIM)
            ap = _sdpa(qp, kp.transpose(0, 1).unsqueeze(0), vp.transpose(0, 1).unsqueeze(0), True)
            x = x + blk.o(torch.cat([ad, ap.squeeze(0).transpose(0, 1).reshape(n, self.hq * HEAD_DIM)]))
            gu = blk.gate_up(rms_norm(x, blk.n2))
            x = x + blk.down(F.silu(gu[:, : blk.inter]) * gu[:, blk.inter:])
        return rms_norm(x[:b], self.blocks[0].n1) @ self.lm_head.t()

    def prefill(self, x: torch.Tensor) -> torch.Tensor:
        n = x.shape[0]
        for blk in self.blocks:
            h = rms_norm(x, blk.n1)
            qkv = blk.qkv(h)
            q = qkv[:, : self.hq * HEAD_DIM].view(n, self.hq, HEAD_DIM).transpose(0, 1).unsqueeze(0)
            kk = qkv[:, self.hq * HEAD_DIM:(self.hq + self.hkv) * HEAD_DIM].view(n, self.hkv, HEAD_DIM)
            vv = qkv[:, (self.hq + self.hkv) * HEAD_DIM:].view(n, self.hkv, HEAD_DIM)
            a = _sdpa(q, kk.transpose(0, 1).unsqueeze(0), vv.transpose(0, 1).unsqueeze(0), True)
            x = x + blk.o(a.squeeze(0).transpose(0, 1).reshape(n, self.hq * HEAD_DIM))
            h = rms_norm(x, blk.n2)
            gu = blk.gate_up(h)
            x = x + blk.down(F.silu(gu[:, : blk.inter]) * gu[:, blk.inter:])
        return rms_norm(x[-1:], self.blocks[0].n1) @ self.lm_head.t()


def section_steps(dev: str, dry: bool, clock: Clock) -> dict:
    out = {"model": "llama-3.1-8b shape, bf16, 32 blocks + LM head", "decode": [], "prefill": []}
    for ctx in ((1024, 4096) if not dry else (32,)):
        kv_per_seq = ctx * 8 * HEAD_DIM * 2 * 2 * 32
        batches = [b for b in ((1, 8, 16, 32, 64, 128, 256) if not dry else (1, 2)) if b * kv_per_seq <= 60e9]
        model = Model(dev, dry, max(batches), ctx)
        for b in batches:
            if clock.left_s() < 30:
                out["decode"].append({"skipped": f"decode B {b} ctx {ctx}: time budget"})
                continue
            x = torch.randn(b, model.h, device=dev, dtype=torch.bfloat16)
            ks, vs = model.k, model.v
            model.k = [k[:b] for k in ks]
            model.v = [v[:b] for v in vs]
            with torch.no_grad():
                s = time_fn(lambda x=x: model.decode(x), dev, reps=3)
            model.k, model.v = ks, vs
            out["decode"].append({"batch": b, "context_tokens": ctx, "step_s": s})
            print(f"  decode step B {b} ctx {ctx}: {s * 1e3:.3f} ms", flush=True)
        if ctx == (1024 if not dry else 32):
            model.k = model.v = []
            if dev == "cuda":
                torch.cuda.empty_cache()
            for n in ((128, 512, 1024, 2048, 4096, 8192) if not dry else (16,)):
                if clock.left_s() < 25:
                    out["prefill"].append({"skipped": f"prefill {n}: time budget"})
                    continue
                x = torch.randn(n, model.h, device=dev, dtype=torch.bfloat16)
                with torch.no_grad():
                    s = time_fn(lambda x=x: model.prefill(x), dev, reps=2)
                out["prefill"].append({"prompt_tokens": n, "step_s": s})
                print(f"  prefill {n}: {s * 1e3:.3f} ms", flush=True)
        del model
        if dev == "cuda":
            torch.cuda.empty_cache()
    return out


def section_mixed_steps(dev: str, dry: bool, clock: Clock) -> list[dict]:
    """B decodes at a 1,024-token context with and without a P-token prefill chunk in the same step."""
    ctx, batches, chunks = (1024, (16, 64, 128), (0, 256, 512, 1024, 2048)) if not dry else (32, (2,), (0, 16))
    out = []
    model = Model(dev, dry, max(batches), ctx)
    for n in chunks[1:]:  # the chunk alone, for the sum
        xp = torch.randn(n, model.h, device=dev, dtype=torch.bfloat16)
        with torch.no_grad():
            s = time_fn(lambda xp=xp: model.prefill(xp), dev, reps=3)
        out.append({"batch": 0, "context_tokens": ctx, "prefill_chunk_tokens": n, "step_s": s})
        print(f"  prefill chunk P {n} alone: {s * 1e3:.3f} ms", flush=True)
    for b in batches:
        ks, vs = model.k, model.v
        model.k, model.v = [k[:b] for k in ks], [v[:b] for v in vs]
        xd = torch.randn(b, model.h, device=dev, dtype=torch.bfloat16)
        for n in chunks:
            if clock.left_s() < 20:
                out.append({"skipped": f"mixed B {b} P {n}: time budget"})
                continue
            xp = torch.randn(n, model.h, device=dev, dtype=torch.bfloat16)
            with torch.no_grad():
                fn = (lambda: model.decode(xd)) if n == 0 else (lambda xp=xp: model.mixed(xd, xp))
                s = time_fn(fn, dev, reps=3)
            out.append({"batch": b, "context_tokens": ctx, "prefill_chunk_tokens": n, "step_s": s})
            print(f"  mixed step B {b} + P {n}: {s * 1e3:.3f} ms", flush=True)
        model.k, model.v = ks, vs
    del model
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True, help="folder for gpu_kernels.json")
    ap.add_argument("--budget-s", type=float, default=300.0, help="stop starting new measurements after this")
    ap.add_argument("--dry-run", action="store_true", help="tiny shapes on the CPU (checks the script)")
    ap.add_argument("--sections", default="", help="comma-separated sections to run (default: all)")
    args = ap.parse_args()
    only = {x for x in args.sections.split(",") if x}
    dev = "cpu" if args.dry_run or not torch.cuda.is_available() else "cuda"
    dry = args.dry_run or dev == "cpu"
    clock = Clock(args.budget_s)
    out_path = Path(args.out) / "gpu_kernels.json"
    out_path.parent.mkdir(parents=True, exist_ok=True)
    res: dict = {"script": "bench/gpu_kernels.py", "torch": torch.__version__, "python": platform.python_version(),
                 "device": dev, "dry_run": dry}
    if dev == "cuda":
        p = torch.cuda.get_device_properties(0)
        res["gpu"] = {"name": p.name, "total_memory_bytes": p.total_memory, "sm_count": p.multi_processor_count,
                      "capability": f"{p.major}.{p.minor}", "cuda": torch.version.cuda}
    fp8_ok = dev == "cuda" and torch.cuda.get_device_capability(0) >= (8, 9) and hasattr(torch, "_scaled_mm")
    torch.manual_seed(0)

    def save() -> None:
        res["elapsed_s"] = args.budget_s - clock.left_s()
        out_path.write_text(json.dumps(res, indent=1))

    for name, fn in (("bandwidth", lambda: section_bandwidth(dev, dry)),
                     ("decode_and_prefill_steps", lambda: section_steps(dev, dry, clock)),
                     ("attention_decode", lambda: section_attention_decode(dev, dry, clock)),
                     ("block_linear", lambda: section_block_linear(dev, dry, clock, ("bf16",))),
                     ("block_linear_fp8", lambda: section_block_linear(dev, dry, clock, ("fp8",) if fp8_ok else ())),
                     ("attention_prefill", lambda: section_attention_prefill(dev, dry, clock)),
                     ("mixed_steps", lambda: section_mixed_steps(dev, dry, clock))):
        if only and name not in only:
            continue
        t0 = time.monotonic()
        try:
            res[name] = fn()
        except Exception as exc:  # keep what the other sections measured
            res[name] = {"error": f"{type(exc).__name__}: {exc}"}
            print(f"{name}: {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
        print(f"{name}: {time.monotonic() - t0:.1f} s", flush=True)
        save()
        if dev == "cuda":
            torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main())
