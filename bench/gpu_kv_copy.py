"""Time KV-cache copies between a CUDA GPU and host memory with torch alone, for the KV-link and CPU-tier models.

A P/D transfer through host memory, and vLLM's CPU offloading connector, move a request's KV blocks over the GPU's
PCIe link. ``lbbench.kv_links`` and ``lbbench.sim.offload`` time such a move as ``latency + bytes / bandwidth``.
This script measures both numbers on the machine it runs on, writing one JSON file:

- ``contiguous``: one copy of N bytes, pinned host to device and device to host, N from 4 KiB to 1 GiB (and a
  pageable host buffer beside the pinned one, for contrast);
- ``paged``: a request's KV in vLLM's paged layout (per layer one K and one V tensor of
  ``[num_blocks, block_size, kv_heads, head_dim]``; Llama-3.1-8B: 32 layers, 8 KV heads, head dim 128, bf16,
  16-token blocks, so 32 KiB per layer, K or V, and block) moved for a request of T tokens two ways: one
  ``cudaMemcpyAsync`` per (layer, K/V, block) chunk, replayed from a captured CUDA graph (what a C++ loop of
  block swaps costs, without Python's launch overhead), and a gather into a contiguous device buffer followed by
  one copy;
- ``fit``: for each direction, latency and bandwidth by least squares of ``time = latency + bytes / bandwidth``
  over the contiguous pinned sizes of 1 MiB and more, and the per-chunk cost of the paged copy.

Every time is the median of repeated CUDA-event timings after a warm-up. Run:
``python bench/gpu_kv_copy.py --out DIR``; ``--dry-run`` checks the script on a CPU with small sizes.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gpu_profile import Timer  # noqa: E402  (median of CUDA-event timings, the wall clock on a CPU)

LAYERS, KV_HEADS, HEAD_DIM, BLOCK_SIZE = 32, 8, 128, 16
BYTES_PER_TOKEN = 2 * LAYERS * KV_HEADS * HEAD_DIM * 2  # K and V, bf16: 128 KiB


def fit_line(points: list[tuple[float, float]]) -> dict[str, float]:
    """Least squares of ``seconds = latency_s + bytes / bytes_s`` over (bytes, seconds) points."""
    n = len(points)
    mx = sum(b for b, _ in points) / n
    my = sum(t for _, t in points) / n
    sxx = sum((b - mx) ** 2 for b, _ in points)
    slope = sum((b - mx) * (t - my) for b, t in points) / sxx
    latency = my - slope * mx
    worst = max(abs(latency + slope * b - t) / t for b, t in points)
    return {"bytes_s": 1.0 / slope, "latency_s": latency, "max_rel_error": worst, "points": n}


def contiguous(dev: str, timer: Timer, sizes: list[int], reps: int) -> list[dict]:
    rows = []
    for n in sizes:
        gpu = torch.empty(n, dtype=torch.uint8, device=dev)
        for host_kind in ("pinned", "pageable"):
            host = torch.empty(n, dtype=torch.uint8, pin_memory=(host_kind == "pinned" and dev == "cuda"))
            h2d = timer(lambda: gpu.copy_(host, non_blocking=True), reps)
            d2h = timer(lambda: host.copy_(gpu, non_blocking=True), reps)
            rows.append({"bytes": n, "host": host_kind, "h2d_s": h2d, "d2h_s": d2h})
            del host
        del gpu
    return rows


def paged(dev: str, timer: Timer, tokens: list[int], reps: int, pool_blocks: int) -> list[dict]:
    """A request's blocks scattered over a pool, moved to (and from) pinned host memory, two ways."""
    pool = [torch.empty(pool_blocks, BLOCK_SIZE, KV_HEADS, HEAD_DIM, dtype=torch.bfloat16, device=dev)
            for _ in range(2 * LAYERS)]
    rows = []
    gen = torch.Generator().manual_seed(0)
    for t in tokens:
        nb = t // BLOCK_SIZE
        ids = torch.randperm(pool_blocks, generator=gen)[:nb].tolist()
        host = torch.empty(2 * LAYERS, nb, BLOCK_SIZE, KV_HEADS, HEAD_DIM, dtype=torch.bfloat16,
                           pin_memory=(dev == "cuda"))

        def per_chunk_d2h() -> None:
            for i, layer in enumerate(pool):
                for j, b in enumerate(ids):
                    host[i, j].copy_(layer[b], non_blocking=True)

        def per_chunk_h2d() -> None:
            for i, layer in enumerate(pool):
                for j, b in enumerate(ids):
                    layer[b].copy_(host[i, j], non_blocking=True)

        index = torch.tensor(ids, device=dev)
        staging = torch.empty_like(host, device=dev)

        def gather_d2h() -> None:
            for i, layer in enumerate(pool):
                torch.index_select(layer, 0, index, out=staging[i])
            host.copy_(staging, non_blocking=True)

        def scatter_h2d() -> None:
            staging.copy_(host, non_blocking=True)
            for i, layer in enumerate(pool):
                layer.index_copy_(0, index, staging[i])

        row = {"tokens": t, "blocks": nb, "chunks": 2 * LAYERS * nb, "bytes": t * BYTES_PER_TOKEN}
        for name, fn in (("per_chunk_d2h", per_chunk_d2h), ("per_chunk_h2d", per_chunk_h2d),
                         ("gather_d2h", gather_d2h), ("scatter_h2d", scatter_h2d)):
            if dev == "cuda":
                side = torch.cuda.Stream()
                side.wait_stream(torch.cuda.current_stream())
                with torch.cuda.stream(side):
                    fn()  # warm allocations before capture
                torch.cuda.current_stream().wait_stream(side)
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph):
                    fn()
                row[f"{name}_s"] = timer(graph.replay, reps)
                row[f"{name}_eager_s"] = timer(fn, max(3, reps // 3), warmup=1)
                del graph
            else:
                row[f"{name}_s"] = timer(fn, reps)
        rows.append(row)
        del host, staging
    return rows


def fits(cont: list[dict], pag: list[dict]) -> dict:
    out = {}
    for d in ("h2d", "d2h"):
        pts = [(r["bytes"], r[f"{d}_s"]) for r in cont if r["host"] == "pinned" and r["bytes"] >= 1 << 20]
        out[f"contiguous_pinned_{d}"] = fit_line(pts)
        small = [r[f"{d}_s"] for r in cont if r["host"] == "pinned" and r["bytes"] <= 16 << 10]
        out[f"contiguous_pinned_{d}"]["small_copy_s"] = min(small) if small else None
    for name in ("per_chunk_d2h", "per_chunk_h2d", "gather_d2h", "scatter_h2d"):
        pts = [(r["bytes"], r[f"{name}_s"]) for r in pag]
        if len(pts) >= 2:
            f = fit_line(pts)
            big = max(pag, key=lambda r: r["bytes"])
            f["effective_bytes_s_largest"] = big["bytes"] / big[f"{name}_s"]
            f["per_chunk_s_largest"] = big[f"{name}_s"] / big["chunks"]
            out[f"paged_{name}"] = f
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--dry-run", action="store_true", help="small sizes on the CPU, to check the script")
    args = ap.parse_args()
    dev = "cuda" if torch.cuda.is_available() and not args.dry_run else "cpu"
    if args.dry_run:
        sizes, tokens, reps, pool = [4 << 10, 1 << 20, 4 << 20], [16, 64], 3, 64
    else:
        sizes = [4 << 10, 16 << 10, 64 << 10, 256 << 10, 1 << 20, 4 << 20, 16 << 20, 64 << 20, 256 << 20, 1 << 30]
        tokens, reps, pool = [256, 1024, 4096, 16384], args.reps, 4096
    timer = Timer(torch.device(dev))
    t0 = time.monotonic()
    cont = contiguous(dev, timer, sizes, reps)
    pag = paged(dev, timer, tokens, max(5, reps // 2), pool)
    result = {
        "script": "bench/gpu_kv_copy.py",
        "device": torch.cuda.get_device_name(0) if dev == "cuda" else platform.processor() or "cpu",
        "torch": torch.__version__, "cuda": torch.version.cuda, "dry_run": args.dry_run,
        "kv_layout": {"layers": LAYERS, "kv_heads": KV_HEADS, "head_dim": HEAD_DIM, "block_size": BLOCK_SIZE,
                      "dtype": "bf16", "bytes_per_token": BYTES_PER_TOKEN},
        "contiguous": cont, "paged": pag, "fit": fits(cont, pag), "wall_s": time.monotonic() - t0,
    }
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "kv_copy.json").write_text(json.dumps(result, indent=1))
    print(json.dumps(result["fit"], indent=1))
    print(f"wall {result['wall_s']:.1f} s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
