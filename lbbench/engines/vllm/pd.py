"""Prefill/decode disaggregation on ``serve-sim``: llm-d's P/D sidecar protocol, emulated.

The protocol (llm-d-inference-scheduler ``docs/disagg_pd.md`` @ ``514e4373``; the routing sidecar,
llm-d/llm-d-routing-sidecar ``internal/proxy/proxy.go`` @ ``0eeb28bb`` and ``internal/proxy/connector_nixlv2.go``
@ ``5a1b9088``, the ``nixlv2`` connector; Apache-2.0):

1. The router picks a decode pod and, when it disaggregates, a prefill pod, named in the request header
   ``x-prefiller-host-port`` (``host:port``, an ``http://`` prefix is tolerated). The request goes to the decode
   pod; without the header the decode pod serves it whole.
2. The decode pod's sidecar sends the prefill pod the request with ``max_tokens`` 1, ``stream`` false, no
   ``stream_options`` and ``kv_transfer_params`` ``{do_remote_decode: true, do_remote_prefill: false,
   remote_engine_id/remote_block_ids/remote_host/remote_port: null}``.
3. The prefill pod answers with its one token and ``kv_transfer_params`` naming where its KV is
   (``do_remote_prefill: true``, ``remote_engine_id``, ``remote_block_ids``, ``remote_host``, ``remote_port``).
4. The sidecar sends its own engine the original request (its ``max_tokens``, ``stream``) with those
   ``kv_transfer_params``; the engine pulls the KV (NIXL) and decodes.

Here the sidecar is inside the decode instance's endpoint (``run_sidecar``), so a client or router only sets the
header and sends to the decode URL; an instance also takes step 2's and step 4's bodies from an outside sidecar.
The prefill instance runs the prompt on its simulated engine and answers step 3 (``prefill_params``; one extra
field, ``lbbench_kv_bytes``: the bytes to move). The decode instance books the transfer on the fleet's
``lbbench.kv_links.KVFabric`` (the simulator's transfer model: ``latency + bytes / bandwidth``, transfers sharing an
endpoint serialized), waits for it on the wall clock, then hands the KV to its engine with the simulator's decode
admission (``lbbench.sim.disagg.admit_landed``: when its blocks fit, at a step boundary) and streams the tokens.
Its response headers carry the TTFT split it measured: ``x-lbbench-prefill-s`` (the sidecar's prefill leg, hop
included), ``x-lbbench-transfer-s`` (from the KV request to its landing, waits for a busy link included),
``x-lbbench-kv-wait-s`` (landing to admission) and ``x-lbbench-transfer-bytes``.
"""

from __future__ import annotations

import asyncio
import copy
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ...core import Request
from ...kv_links import KVLinkError, kv_bytes_per_token

if TYPE_CHECKING:  # the emulator imports this module
    from aiohttp import web

    from .emulator import EmulatedInstance

#: the header naming the prefill pod (llm-d's ``requestHeaderPrefillHostPort``)
PREFILLER_HEADER = "x-prefiller-host-port"
KV_TRANSFER_PARAMS = "kv_transfer_params"
#: the TTFT split a decode instance measured, in its response headers (seconds; bytes)
TIMING_HEADERS = {"prefill_s": "x-lbbench-prefill-s", "transfer_s": "x-lbbench-transfer-s",
                  "kv_wait_s": "x-lbbench-kv-wait-s", "transfer_bytes": "x-lbbench-transfer-bytes"}


def prefiller_url(value: str) -> str:
    """The ``x-prefiller-host-port`` header -> the prefill instance's base URL; raises ``ValueError``."""
    hp = value.strip().removeprefix("http://").rstrip("/")
    host, sep, port = hp.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"{PREFILLER_HEADER}: {value!r} is not host:port")
    return "http://" + hp


def host_port(url: str) -> str:
    """``http://host:port`` -> ``host:port`` (what the header names)."""
    return url.split("://", 1)[-1].rstrip("/")


def prefill_body(body: dict) -> dict:
    """Step 2: what the sidecar sends the prefill instance."""
    out = copy.deepcopy(body)
    out[KV_TRANSFER_PARAMS] = {"do_remote_decode": True, "do_remote_prefill": False, "remote_engine_id": None,
                               "remote_block_ids": None, "remote_host": None, "remote_port": None}
    out["stream"] = False
    out.pop("stream_options", None)
    out["max_tokens"] = 1
    return out


def decode_body(body: dict, params: Any) -> dict:
    """Step 4: the original request with the prefill instance's ``kv_transfer_params`` (None: none came back, the
    decode instance prefills itself)."""
    out = copy.deepcopy(body)
    out.pop(KV_TRANSFER_PARAMS, None)
    if params is not None:
        out[KV_TRANSFER_PARAMS] = params
    return out


def _params(body: dict) -> dict | None:
    p = body.get(KV_TRANSFER_PARAMS)
    if p is None:
        return None
    if not isinstance(p, dict):
        raise ValueError(f"'{KV_TRANSFER_PARAMS}' must be an object")
    return p


def is_remote_decode(body: dict) -> bool:
    """Whether ``body`` is a prefill leg (step 2): its KV is for another instance."""
    p = _params(body)
    return bool(p and p.get("do_remote_decode"))


def remote_prefill(body: dict) -> dict | None:
    """Step 4's ``kv_transfer_params`` when ``body`` asks to pull a prefilled KV, else None; raises ``ValueError``
    for malformed ones."""
    p = _params(body)
    if not p or not p.get("do_remote_prefill"):
        return None
    if not isinstance(p.get("remote_block_ids"), list) or p.get("remote_engine_id") is None:
        raise ValueError(f"'{KV_TRANSFER_PARAMS}': do_remote_prefill needs remote_engine_id and remote_block_ids")
    nb = p.get("lbbench_kv_bytes")
    if nb is not None and (not isinstance(nb, (int, float)) or isinstance(nb, bool) or nb < 0):
        raise ValueError(f"'{KV_TRANSFER_PARAMS}': lbbench_kv_bytes must be a number >= 0")
    return p


def instance_kv_bytes_per_token(inst: "EmulatedInstance") -> float:
    """KV bytes per token of ``inst``'s profile (0 for a profile that says none, as ``zero``)."""
    try:
        return kv_bytes_per_token(inst.profile)
    except KVLinkError:
        return 0.0


def prefill_params(inst: "EmulatedInstance", prompt_tokens: int) -> dict:
    """Step 3: where the prefilled KV is. It is every prompt token's but the last (vLLM's NIXL connector loads
    ``prompt - 1`` tokens; the decode instance computes the last), as the simulator moves."""
    tokens = max(0, prompt_tokens - 1)
    host, _, port = host_port(inst.url).rpartition(":")
    return {"do_remote_decode": False, "do_remote_prefill": True, "remote_engine_id": inst.engine_id,
            "remote_block_ids": list(range(-(-tokens // inst.profile.block_size))), "remote_host": host,
            "remote_port": int(port), "tp_size": 1, "lbbench_kv_bytes": tokens * instance_kv_bytes_per_token(inst)}


def transfer_bytes(params: dict, prompt_tokens: int, inst: "EmulatedInstance") -> float:
    """Bytes a step-4 request pulls: what the prefill instance said, else ``prompt - 1`` tokens at ``inst``'s
    KV bytes per token."""
    nb = params.get("lbbench_kv_bytes")
    return float(nb) if nb is not None else max(0, prompt_tokens - 1) * instance_kv_bytes_per_token(inst)


def timing_headers(timing: dict[str, float]) -> dict[str, str]:
    return {TIMING_HEADERS[k]: f"{v:.9g}" for k, v in timing.items() if k in TIMING_HEADERS}


def parse_timing(headers: Any) -> dict[str, float]:
    """Response headers (any mapping with ``get``, names lower-case) -> the TTFT split they carry ({}: none)."""
    out = {}
    for key, name in TIMING_HEADERS.items():
        v = headers.get(name)
        if v is not None:
            try:
                out[key] = float(v)
            except ValueError:
                continue
    return out


# ---------------------------------------------------------------------------------------------- the instance
@dataclass
class _Landing:
    """A KV on its way into a decode instance's engine (``admit_landed``'s leg)."""

    request: Request
    num_bytes: float
    admitted: asyncio.Future = field(repr=False)


async def run_sidecar(inst: "EmulatedInstance", request: "web.Request", body: dict, chat: bool,
                      prefiller: str) -> "web.StreamResponse":
    """Steps 2-4 inside the decode instance: the prefill leg over HTTP, then this instance's own decode."""
    from aiohttp import ClientError, ClientSession, web  # lazy, as the emulator

    try:
        url = prefiller_url(prefiller)
    except ValueError as exc:
        return web.json_response({"error": {"message": str(exc), "type": "BadRequestError", "code": 400}},
                                 status=400)
    if inst.sidecar_session is None:
        inst.sidecar_session = ClientSession()
    t0 = inst._loop.time()
    rid = request.headers.get("x-request-id")
    try:
        async with inst.sidecar_session.post(url + request.path, json=prefill_body(body),
                                             headers={"x-request-id": rid} if rid else None) as up:
            data = await up.read()
            if up.status != 200:  # as the sidecar: the prefill's status goes back
                return web.Response(body=data, status=up.status, content_type="application/json")
            answer = await up.json(content_type=None)
    except (ClientError, OSError, ValueError) as exc:
        return web.json_response({"error": {"message": f"prefill at {url}: {type(exc).__name__}: {exc}",
                                            "code": 502}}, status=502)
    params = answer.get(KV_TRANSFER_PARAMS) if isinstance(answer, dict) else None
    return await inst._serve_body(request, decode_body(body, params), chat,
                                  timing={"prefill_s": inst._loop.time() - t0})


async def receive_kv(inst: "EmulatedInstance", request: Request, params: dict,
                     timing: dict[str, float]) -> None:
    """Step 4 on the decode instance: wait for the transfer booked on the fleet's fabric, then until the engine
    takes the KV (``admit`` from the instance's driver). Fills ``timing``."""
    loop = inst._loop
    now = loop.time()
    num_bytes = transfer_bytes(params, request.prompt_tokens, inst)
    _, end = inst.fabric.reserve(str(params["remote_engine_id"]), inst.engine_id, now, num_bytes)
    if end > now:
        await asyncio.sleep(end - now)
    landing = _Landing(request, num_bytes, loop.create_future())
    if not inst.landed:
        inst.kv_retry_s = None
    inst.landed.append(landing)
    inst._poke()
    try:
        admit_s = await landing.admitted  # on the instance's clock
    except asyncio.CancelledError:
        if landing in inst.landed:
            inst.landed.remove(landing)
        raise
    timing.update(transfer_s=end - now, kv_wait_s=max(0.0, inst._t0 + admit_s - end), transfer_bytes=num_bytes)
    inst.num_kv_received += 1


def admit(inst: "EmulatedInstance", now_s: float) -> float | None:
    """Hand the KV that landed to ``inst``'s engine (its driver calls this before advancing the engine to
    ``now_s``); returns when to try again. A retry is run at the step boundary it waited for (a little before
    ``now_s`` on the wall clock), where the simulator would run it: at ``now_s`` a new segment of steps would
    have begun and the KV would wait for the next boundary again, and again, while the engine decodes."""
    from ...sim.disagg import admit_landed  # lazy: the replay client reads this module's headers only

    def admitted(leg: _Landing, t: float) -> None:
        if not leg.admitted.done():
            leg.admitted.set_result(t)

    def fail(_sim: Any, leg: _Landing, error: str) -> None:
        s = inst.streams.get(leg.request.request_id)
        if s is not None:
            s.error, s.done = error, True
            s.event.set()
        admitted(leg, now_s)

    r = inst.kv_retry_s
    t = r if r is not None and r <= now_s else now_s
    inst.kv_retry_s = admit_landed(inst.sim, inst.landed, t, inst._apply, admitted, fail)
    return inst.kv_retry_s
