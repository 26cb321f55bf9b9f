"""The links a request's KV crosses from a prefill instance to a decode instance, and how many bytes it is.

A transfer of ``n`` bytes over a link of bandwidth ``B`` (bytes/s, one direction) and latency ``L`` takes
``L + n / B``. Named links (``--kv-link NAME``), one direction each, physics from datasheets except ``pcie5``,
which is measured:

| name | bandwidth | what it is |
|---|---|---|
| ``nvlink4`` | 450 GB/s | NVLink 4 (H100 SXM datasheet: 900 GB/s bidirectional): prefill and decode GPUs in one NVLink domain |
| ``nvlink3`` | 300 GB/s | NVLink 3 (A100 SXM datasheet: 600 GB/s bidirectional) |
| ``rdma-400g`` | 50 GB/s | one 400 Gb/s InfiniBand / RoCE NIC per GPU (NVIDIA ConnectX-7, as a DGX H100 has: 8 x 400 Gb/s) |
| ``rdma-200g`` | 25 GB/s | one 200 Gb/s NIC per GPU (ConnectX-6, as a DGX A100 has: 8 x 200 Gb/s) |
| ``pcie5`` | 55 GB/s | PCIe 5.0 x16 through pinned host memory, **measured** (below; the datasheet says 64 GB/s) |
| ``pcie4`` | 32 GB/s | PCIe 4.0 x16 (64 GB/s bidirectional) |

The datasheet links are the figures of ``lbbench.profiling.gpus`` (``link_bytes_s``, ``host_link_bytes_s``), and
their latencies are assumptions (a transfer's fixed cost: posting the read, the completion, the connector's
bookkeeping): 5 us on NVLink, 20 us over RDMA. ``pcie5`` is what ``bench/gpu_kv_copy.py`` measured on an H200
host (PCIe Gen 5 x16, torch 2.11, CUDA 13.0; ``bench/data/h200_kv_copy.json``): one contiguous copy to or from
pinned host memory reaches 54.5-55.3 GB/s from 64 MiB up, and ``8 us + n / 55.3 GB/s`` fits device-to-host
copies of 1 MiB to 1 GiB within 3.4 %. That is a connector that gathers a request's blocks first (measured: a
gather into one buffer, then one copy, 51-54 GB/s for 1,024-16,384 tokens of Llama-3.1-8B); one that copies
block by block (32 KiB per layer, K or V, and 16-token block) reached only 10.3-11.6 GB/s, 2.8-3.2 us per
copy, even replayed from a CUDA graph: give such a connector ``--kv-link 11e9@8e-6``. ``pcie4`` stays the
datasheet's half of 64 GB/s, with 10 us assumed. ``BYTES_S[@LATENCY_S]`` (``--kv-link 40e9@50e-6``) gives any other link;
``NAME@LATENCY_S`` overrides a named link's latency.

A request's KV is ``kv_bytes_per_token(profile)`` bytes per token: the profile's ``[kv] kv_bytes_per_block``
over its block size when it says, else ``2 x layers x KV heads x head dim x dtype bytes`` of the model config its
``[physics] model_config`` names (the shipped configs under ``lbbench/profiling/models``; 128 KiB for
Llama-3.1-8B in bf16).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from .errors import InputError
from .profiles import Profile

#: where the shipped model configs are (read as data: the ground floor imports nothing above it)
MODELS_DIR = Path(__file__).resolve().parent / "profiling" / "models"
DTYPE_BYTES = {"fp32": 4, "float32": 4, "bf16": 2, "bfloat16": 2, "fp16": 2, "float16": 2, "fp8": 1}


class KVLinkError(InputError):
    """A KV link that cannot carry anything (the message names the ``kv_link`` field)."""


@dataclass(frozen=True)
class KVLink:
    """One direction of the link a KV transfer crosses."""

    name: str
    bytes_s: float
    latency_s: float

    def transfer_s(self, num_bytes: float) -> float:
        """Seconds ``num_bytes`` take on an idle link."""
        return self.latency_s + num_bytes / self.bytes_s


LINKS: dict[str, KVLink] = {
    "nvlink4": KVLink("nvlink4", 450e9, 5e-6),
    "nvlink3": KVLink("nvlink3", 300e9, 5e-6),
    "rdma-400g": KVLink("rdma-400g", 50e9, 20e-6),
    "rdma-200g": KVLink("rdma-200g", 25e9, 20e-6),
    "pcie5": KVLink("pcie5", 55e9, 8e-6),
    "pcie4": KVLink("pcie4", 32e9, 10e-6),
}
DEFAULT_LINK = "rdma-400g"


class KVFabric:
    """Transfers on one link kind between endpoints (an instance's NIC or NVLink port, one direction each): a
    transfer holds its source's egress and its destination's ingress for its whole duration, so transfers that
    share an endpoint are **serialized, first come first served** (no bandwidth sharing). Endpoints are any
    hashable keys (instance indices in the simulator, engine ids in ``serve-sim``); times on any one clock.
    The one transfer model of both: ``lbbench.sim.disagg`` and ``lbbench.engines.vllm.pd``."""

    def __init__(self, link: KVLink):
        self.link = link
        self._egress_free_s: dict = {}
        self._ingress_free_s: dict = {}

    def reserve(self, src, dst, now_s: float, num_bytes: float) -> tuple[float, float]:
        """Book a transfer of ``num_bytes`` from ``src`` to ``dst`` asked for at ``now_s``: ``(start_s, end_s)``,
        the start when both endpoints are free."""
        start = max(now_s, self._egress_free_s.get(src, now_s), self._ingress_free_s.get(dst, now_s))
        end = start + self.link.transfer_s(num_bytes)
        self._egress_free_s[src] = self._ingress_free_s[dst] = end
        return start, end

    def copy(self) -> "KVFabric":
        new = KVFabric(self.link)
        new._egress_free_s, new._ingress_free_s = dict(self._egress_free_s), dict(self._ingress_free_s)
        return new


def parse_kv_link(text: str) -> KVLink:
    """``NAME``, ``NAME@LATENCY_S`` or ``BYTES_S[@LATENCY_S]`` → a ``KVLink``; raises ``KVLinkError``."""
    head, _, lat_text = text.strip().partition("@")
    head = head.strip()
    if head in LINKS:
        link = LINKS[head]
    else:
        try:
            bw = float(head)
        except ValueError:
            raise KVLinkError(f"kv_link: {text!r} is neither a link ({', '.join(LINKS)}) nor BYTES_S[@LATENCY_S]"
                              ) from None
        if not bw > 0 or bw == float("inf"):
            raise KVLinkError(f"kv_link: {text!r}: a link needs a bandwidth > 0 bytes/s")
        link = KVLink(head, bw, 0.0)
    if lat_text:
        try:
            lat = float(lat_text)
        except ValueError:
            raise KVLinkError(f"kv_link: {text!r}: latency {lat_text!r} is not a number of seconds") from None
        if not 0 <= lat < float("inf"):
            raise KVLinkError(f"kv_link: {text!r}: latency must be >= 0 s")
        link = KVLink(link.name, link.bytes_s, lat)
    return link


def kv_bytes_per_token(profile: Profile) -> float:
    """KV bytes one token holds on ``profile``'s instance (all layers, all its GPUs); raises ``KVLinkError``
    when the profile says neither ``kv_bytes_per_block`` nor a known model config."""
    if profile.kv_bytes_per_block > 0:
        return profile.kv_bytes_per_block / profile.block_size
    name = str(profile.physics.get("model_config", ""))
    path = MODELS_DIR / f"{name}.json"
    if not name or not path.is_file():
        raise KVLinkError(f"kv_link: profile {profile.name!r} says no KV bytes per token (set [kv] "
                          "kv_bytes_per_block, or [physics] model_config to a shipped model config)")
    cfg = json.loads(path.read_text())
    cfg = cfg.get("text_config", cfg)
    heads = int(cfg["num_attention_heads"])
    head_dim = int(cfg.get("head_dim") or int(cfg["hidden_size"]) // heads)
    kv_heads = int(cfg.get("num_key_value_heads") or heads)
    dtype = str(profile.physics.get("dtype", "bf16"))
    return 2.0 * int(cfg["num_hidden_layers"]) * kv_heads * head_dim * DTYPE_BYTES.get(dtype, 2)
