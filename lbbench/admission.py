"""Flow control and admission at the gateway: a bounded queue with priority bands and per-tenant fairness.

A production gateway does not hand every request to the router. llm-d's flow control (the endpoint picker's
``flowcontrol`` layer: ``kubernetes-sigs/gateway-api-inference-extension``
``pkg/epp/flowcontrol/registry/config.go`` @ ``0e431c539cb8490f42ba9a60283fe57ced398fed`` and
``pkg/epp/flowcontrol/controller/internal/processor.go`` @ ``c2bc49ba6d5a68c59bba43e7d48c6bfa4c9a462c``,
Apache-2.0) keys every request by a flow, (fairness id, priority): requests wait in per-flow queues grouped in
priority bands (higher priority first, strictly), a fairness policy picks the flow to serve next inside a band
(round robin or global first-come-first-served), a saturation detector holds the queues while the pool is busy,
and a request that finds the queues at capacity is rejected (HTTP 429; a queued request evicted later is a
503). lbbench models that here, as one ``FlowController`` the ``Dispatcher`` consults, the same object in the
simulator, the live replay and ``lbbench proxy``:

- **Held at the gateway.** An arriving request joins its tenant's queue in its priority band. It is released to
  the router's queue while the pool has room: the free slots ``sum(max(0, max_outstanding - outstanding))`` over
  healthy instances, less the requests already waiting at the router (a concurrency saturation detector;
  ``max_outstanding`` defaults to each instance's ``max_num_seqs``, beyond which an engine only queues). The gate
  is pool-wide: the router still picks the instance, so a router blind to load may send a request past one
  instance's limit while another has room.
- **Released in order.** The highest band first; inside a band the tenant next in round robin (``fairness=
  round_robin``) or the oldest head of any tenant (``fairness=fcfs``, llm-d's default global strict policy);
  first come, first served inside a tenant.
- **Shed when full.** While more than ``max_queue`` requests are held, one is shed: from the lowest band, the
  tenant holding the most there (ties: the tenant whose newest request came last), its newest request. The
  arriving request itself is rejected with 429 (queue at capacity); an earlier one pushed out by it is evicted
  with 503 (displaced).

Requests carry their tenant and band (``Request.tenant``, ``Request.priority_band``); ``assign_tenants`` gives a
workload's requests tenants drawn by share (a session stays with one tenant). lbbench's own design choices, not
llm-d's: capacity is counted in requests (llm-d counts bytes), and displacement sheds from the fullest tenant.
"""

from __future__ import annotations

import random
from collections import deque
from dataclasses import dataclass, replace
from typing import Iterable, Sequence

from .core import ClusterView, InstanceSpec, Request
from .errors import InputError

FAIRNESS = ("round_robin", "fcfs")
#: HTTP statuses of shed requests: rejected on arrival (queue at capacity), evicted after being held (displaced)
STATUS_REJECTED, STATUS_EVICTED = 429, 503
#: how the error of every shed request begins (records and the proxy's HTTP answers alike)
SHED_PREFIX = "shed by flow control"


def shed_message(status: int) -> str:
    """The error a request shed with ``status`` carries: rejected on arrival (429) or displaced (503)."""
    why = "queue at capacity" if status == STATUS_REJECTED else "displaced by a higher-priority request"
    return f"{SHED_PREFIX} ({status}): {why}"


class AdmissionError(InputError):
    """A bad ``--admission`` or ``--tenants`` spec, or a request of an unknown tenant; names its field
    (``admission`` or ``tenants``), given as the message's leading ``FIELD: ``."""

    def __init__(self, problem: str, field: str | None = None):
        if field is None:
            head, sep, rest = problem.partition(": ")
            if sep and head in ("admission", "tenants"):
                field, problem = head, rest
        super().__init__(problem, field)


@dataclass(frozen=True)
class Tenant:
    """One tenant (llm-d's fairness id): its name, its priority band (higher is served first) and its share of
    the traffic when ``assign_tenants`` draws tenants for a workload."""

    name: str
    priority: int = 0
    share: float = 1.0


@dataclass(frozen=True)
class AdmissionSpec:
    """``--admission max_queue=N[,max_outstanding=N][,fairness=round_robin|fcfs]``."""

    max_queue: int
    """Requests held at the gateway at most (all bands together); more are shed."""
    max_outstanding: int | None = None
    """Requests in flight per instance before it counts as saturated (None: its ``max_num_seqs``)."""
    fairness: str = "round_robin"

    def describe(self) -> str:
        out = f"max_queue={self.max_queue}"
        if self.max_outstanding is not None:
            out += f",max_outstanding={self.max_outstanding}"
        return out + f",fairness={self.fairness}"


def _int(key: str, value: str, field_name: str, minimum: int) -> int:
    try:
        n = int(value)
    except ValueError:
        raise AdmissionError(f"{field_name}: {key}={value!r} is not an integer") from None
    if n < minimum:
        raise AdmissionError(f"{field_name}: {key}={n} must be >= {minimum}")
    return n


def parse_admission(text: str) -> AdmissionSpec:
    """``max_queue=N[,max_outstanding=N][,fairness=round_robin|fcfs]`` -> ``AdmissionSpec``; errors start with
    ``admission:`` (the CLI names the flag)."""
    kv: dict[str, str] = {}
    for part in (p.strip() for p in text.split(",") if p.strip()):
        key, sep, value = part.partition("=")
        if not sep or not value.strip():
            raise AdmissionError(f"admission: {part!r} is not KEY=VALUE (keys: max_queue, max_outstanding, fairness)")
        key = key.strip()
        if key not in ("max_queue", "max_outstanding", "fairness"):
            raise AdmissionError(f"admission: unknown key {key!r} (keys: max_queue, max_outstanding, fairness)")
        kv[key] = value.strip()
    if "max_queue" not in kv:
        raise AdmissionError("admission: give max_queue=N, the requests held at the gateway at most")
    fairness = kv.get("fairness", "round_robin")
    if fairness not in FAIRNESS:
        raise AdmissionError(f"admission: fairness={fairness!r} (choose from {', '.join(FAIRNESS)})")
    mo = kv.get("max_outstanding")
    return AdmissionSpec(_int("max_queue", kv["max_queue"], "admission", 0),
                         None if mo is None else _int("max_outstanding", mo, "admission", 1), fairness)


def parse_tenants(text: str) -> tuple[Tenant, ...]:
    """``NAME[:PRIORITY][@SHARE],...`` -> tenants (priority default 0, share default 1); errors start with
    ``tenants:``."""
    out: list[Tenant] = []
    for part in (p.strip() for p in text.split(",") if p.strip()):
        head, _, share_s = part.partition("@")
        name, _, prio_s = head.partition(":")
        name = name.strip()
        if not name:
            raise AdmissionError(f"tenants: {part!r} has no name (NAME[:PRIORITY][@SHARE])")
        try:
            prio = int(prio_s) if prio_s.strip() else 0
        except ValueError:
            raise AdmissionError(f"tenants: {part!r}: priority {prio_s!r} is not an integer") from None
        try:
            share = float(share_s) if share_s.strip() else 1.0
        except ValueError:
            raise AdmissionError(f"tenants: {part!r}: share {share_s!r} is not a number") from None
        if not share > 0:
            raise AdmissionError(f"tenants: {part!r}: share must be > 0")
        if any(t.name == name for t in out):
            raise AdmissionError(f"tenants: {name!r} given twice")
        out.append(Tenant(name, prio, share))
    if not out:
        raise AdmissionError("tenants: give at least one NAME[:PRIORITY][@SHARE]")
    return tuple(out)


def assign_tenants(requests: Sequence[Request], tenants: Sequence[Tenant], seed: int) -> list[Request]:
    """Each request with a tenant drawn by share (seeded; every turn of a session draws its session's) and that
    tenant's priority band. A request that already names a tenant keeps it and takes its band; an unknown one is
    an ``AdmissionError``."""
    by_name = {t.name: t for t in tenants}
    rng = random.Random(f"tenants:{seed}")
    names = [t.name for t in tenants]
    weights = [t.share for t in tenants]
    of_session: dict[int, str] = {}
    out = []
    for r in sorted(requests, key=lambda r: (r.arrival_s, r.request_id)):
        name = r.tenant
        if name is None:
            if r.session_id is not None and r.session_id in of_session:
                name = of_session[r.session_id]
            else:
                name = rng.choices(names, weights)[0]
        elif name not in by_name:
            raise AdmissionError(f"tenants: request {r.request_id} names tenant {name!r}, not among "
                                 f"{', '.join(names)}")
        if r.session_id is not None:
            of_session.setdefault(r.session_id, name)
        out.append(replace(r, tenant=name, priority_band=by_name[name].priority))
    order = {r.request_id: i for i, r in enumerate(requests)}
    return sorted(out, key=lambda r: order[r.request_id])


class _Band:
    """One priority band: a queue per tenant, the round-robin order of the tenants, the band's count."""

    __slots__ = ("flows", "rr", "num_held")

    def __init__(self) -> None:
        self.flows: dict[str | None, deque[tuple[int, Request]]] = {}
        self.rr: deque[str | None] = deque()
        self.num_held = 0


class FlowController:
    """The gateway's held requests (see the module docstring). ``hold`` a request, ``release`` what the pool has
    room for, ``shed`` what is over capacity; the ``Dispatcher`` calls the three."""

    def __init__(self, spec: AdmissionSpec, specs: Iterable[InstanceSpec]):
        self.spec = spec
        self.limits = [spec.max_outstanding or s.max_num_seqs for s in specs]
        self._bands: dict[int, _Band] = {}
        self._seq = 0  # arrival order at the gateway
        self.num_held = 0
        self.num_rejected = 0
        self.num_evicted = 0

    def fork(self) -> "FlowController":
        """An independent copy (a simulator's ``clone``): the held requests themselves are shared, immutable."""
        new = FlowController.__new__(FlowController)
        new.__dict__.update(self.__dict__)
        new.limits = list(self.limits)
        new._bands = {}
        for p, b in self._bands.items():
            c = new._bands[p] = _Band()
            c.flows = {t: deque(f) for t, f in b.flows.items()}
            c.rr, c.num_held = deque(b.rr), b.num_held
        return new

    def hold(self, request: Request) -> None:
        band = self._bands.get(request.priority_band)
        if band is None:
            band = self._bands[request.priority_band] = _Band()
        flow = band.flows.get(request.tenant)
        if flow is None:
            flow = band.flows[request.tenant] = deque()
            band.rr.append(request.tenant)
        self._seq += 1
        flow.append((self._seq, request))
        band.num_held += 1
        self.num_held += 1

    def room(self, view: ClusterView, num_queued: int) -> int:
        """Requests the pool can take now: free slots on healthy instances less those waiting at the router."""
        free = sum(max(0, lim - iv.num_outstanding) for lim, iv in zip(self.limits, view.instances) if iv.healthy)
        return free - num_queued

    def release(self, n: int) -> list[Request]:
        """Up to ``n`` held requests, in the order they are served (bands, then fairness, then arrival)."""
        out: list[Request] = []
        while len(out) < n and self.num_held:
            prio = max(p for p, b in self._bands.items() if b.num_held)
            out.append(self._take_next(self._bands[prio]))
        return out

    def _take_next(self, band: _Band) -> Request:
        if self.spec.fairness == "fcfs":
            tenant = min((f[0][0], t) for t, f in band.flows.items() if f)[1]
        else:
            while not band.flows[band.rr[0]]:
                band.rr.rotate(-1)
            tenant = band.rr[0]
            band.rr.rotate(-1)  # the next tenant goes first next time
        _, req = band.flows[tenant].popleft()
        band.num_held -= 1
        self.num_held -= 1
        return req

    def withdraw(self, request_id: int) -> Request | None:
        """Take a held request out (its client went away); None when it is not held."""
        for band in self._bands.values():
            for flow in band.flows.values():
                for k, (_, r) in enumerate(flow):
                    if r.request_id == request_id:
                        del flow[k]
                        band.num_held -= 1
                        self.num_held -= 1
                        return r
        return None

    def shed(self) -> list[Request]:
        """Requests shed to bring the held ones back to ``max_queue``: from the lowest band, the tenant holding the
        most (ties: the one whose newest request came last), its newest request."""
        out = []
        while self.num_held > self.spec.max_queue:
            prio = min(p for p, b in self._bands.items() if b.num_held)
            band = self._bands[prio]
            tenant = max(((len(f), f[-1][0]), t) for t, f in band.flows.items() if f)[1]
            _, req = band.flows[tenant].pop()
            band.num_held -= 1
            self.num_held -= 1
            out.append(req)
        return out
