"""Soak: a long streaming replay through `lbbench proxy` while its backends are killed and restarted.

Four emulated A100 instances (`lbbench serve-sim --instances 1 --profile llama3.1-8b-a100-v0`, each its own process
on its own port) behind `lbbench proxy --router least_requests` (its own process). This process replays a
streaming Poisson workload through the proxy (one endpoint) at ``--rate`` (80 req/s) for ``--minutes`` (30),
with the load workers `lbbench run` picks by default (``auto_load_workers``). Every ``--kill-every`` minutes (5)
one backend, in turn, is killed (SIGKILL) — just before, the proxy's in-flight gauge for it is read — and started
again on the same port ``--down`` seconds later.

Reports:
- records: requests sent, recorded, recorded twice (must be 0);
- failures, and whether each is explained: a failed request must have been sent before a kill and not finished
  by then (in flight when a backend died); per kill, the failures it explains against the proxy's in-flight
  gauge of the killed backend; failures explained by no kill (target: 0);
- RSS over time of the proxy process and of the client (this process plus its load workers), from
  ``/proc/PID/status``, and the growth from the first sample after ``--warmup`` seconds to the last one taken
  while the replay ran (target: <= 50 MB over 30 minutes);
- the backlog: the proxy's in-flight count over time and its least-squares slope after warm-up (requests/min),
  beside the same count for the same requests in the simulator (`ClusterSim`, the same four instances and router,
  no kills: physics-derived, the emulated GPUs' own capacity). A live backlog that grows while the simulated one
  does not means the host falls behind; both growing means the rate is above what the emulated fleet carries, and
  every process then holds a growing set of open streams (their buffers are what RSS follows).

With ``--admission SPEC`` the proxy runs flow control (``lbbench proxy --admission SPEC``, ``lbbench.admission``):
under overload it holds at most ``max_queue`` requests and answers the rest 429 (503 for one displaced). Then the
script also reports the shed requests: every one must be a record with its 429/503 (never lost), and the records'
count per status must equal the proxy's own ``lbbench_proxy_requests_total`` for that status; the proxy's RSS is
given as first / peak / last and as its least-squares slope over the last ``--slope-minutes`` (20) of the replay,
beside the host's load average at each sample and the rate the client achieved (records' send times).

A summary is written to ``--out`` (JSON) with every sample and kill.

    python bench/soak_proxy.py [--minutes 30] [--kill-every 5] [--rate 80] [--sample-every 30] [--out FILE]
                               [--load-workers auto|N] [--admission max_queue=N,...] [--slope-minutes 20]
"""

from __future__ import annotations

import argparse
import json
from collections import Counter
import multiprocessing
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_proxy import wait_healthy  # noqa: E402

from lbbench.admission import SHED_PREFIX  # noqa: E402
from lbbench.core import Request  # noqa: E402
from lbbench.engines.vllm.emulator import free_port, free_port_range  # noqa: E402
from lbbench.experiment.config import auto_load_workers  # noqa: E402
from lbbench.harness.replay import ReplaySettings, run_replay  # noqa: E402
from lbbench.live.saturation import backlog_at, slope  # noqa: E402
from lbbench.routers import get_router  # noqa: E402

LB = [sys.executable, "-m", "lbbench.cli"]
PROFILE = "llama3.1-8b-a100-v0"


def rss_mb(pid: int) -> float:
    """Resident set size of one process (MB), 0 when it is gone."""
    try:
        text = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return 0.0
    m = re.search(r"^VmRSS:\s+(\d+) kB", text, re.M)
    return int(m.group(1)) / 1024 if m else 0.0


def in_flight(gateway: str, backend: str) -> int:
    try:
        text = urllib.request.urlopen(gateway + "/metrics", timeout=5).read().decode()
    except OSError:
        return -1
    m = re.search(r'lbbench_proxy_backend_in_flight\{backend="' + re.escape(backend) + r'"\} (\d+)', text)
    return int(m.group(1)) if m else -1


def proxy_metrics(gateway: str) -> str:
    """The proxy's /metrics text ("" when it does not answer)."""
    try:
        return urllib.request.urlopen(gateway + "/metrics", timeout=5).read().decode()
    except OSError:
        return ""


def in_flight_total(text: str) -> int:
    """Requests in flight at the proxy, all backends, from its /metrics text (-1 when there is none)."""
    if not text:
        return -1
    return sum(int(n) for n in re.findall(r'lbbench_proxy_backend_in_flight\{backend="[^"]*"\} (\d+)', text))


def held_at_gateway(text: str) -> int:
    """Requests waiting at the proxy (held by flow control or queued for the router; -1 without /metrics)."""
    m = re.search(r"^lbbench_proxy_queue_depth (\d+)", text, re.M)
    return int(m.group(1)) if m else -1


def answered_by_status(text: str) -> dict[str, int]:
    """The proxy's ``lbbench_proxy_requests_total`` by status."""
    return {s: int(n) for s, n in re.findall(r'lbbench_proxy_requests_total\{status="([^"]+)"\} (\d+)', text)}


def load_average_1m() -> float:
    """The host's 1-minute load average (runnable processes; the host has ``os.cpu_count()`` cores)."""
    try:
        return float(Path("/proc/loadavg").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return -1.0


def start_backend(port: int) -> subprocess.Popen:
    return subprocess.Popen(LB + ["serve-sim", "--instances", "1", "--profile", PROFILE, "--port", str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def slope_per_min(ts: list[float], ys: list[float]) -> float:
    """Least-squares slope of ``ys`` against ``ts`` (seconds), per minute; 0 with fewer than 2 points."""
    return 60.0 * slope(list(zip(ts, ys)))


def simulated_in_flight(reqs: list[Request], times_s: list[float],
                        admission: str | None = None) -> tuple[list[int], dict[int, int]]:
    """Requests arrived and not ended (held at the gateway or at an instance) at each of ``times_s`` (run clock),
    when the simulator serves ``reqs`` on the soak's fleet (4 x PROFILE, least_requests, no kills), with the same
    flow control; and the requests it shed, by HTTP status."""
    from lbbench.admission import parse_admission
    from lbbench.profiles import load_profile
    from lbbench.sim.cluster import ClusterSim

    prof = load_profile(PROFILE)
    recs = ClusterSim(prof, 4, reqs, seed=0, run_id="soak-sim",
                      admission=parse_admission(admission) if admission else None).run(
        get_router("least_requests", num_instances=4, seed=0, profile=prof))
    ends = [r.dispatch_s if r.http_status in (429, 503) else r.finish_s for r in recs]  # shed: ends when shed
    shed = Counter(r.http_status for r in recs if r.http_status in (429, 503))
    return backlog_at([r.arrival_s for r in recs], ends, times_s), dict(shed)


def workload(rate: float, minutes: float, seed: int) -> list[Request]:
    rng = np.random.default_rng(seed)
    n = int(rate * minutes * 60)
    t = np.cumsum(rng.exponential(1 / rate, n))
    prompt = rng.integers(64, 513, n)
    out = rng.integers(32, 257, n)
    return [Request(i, float(t[i]), int(prompt[i]), int(out[i])) for i in range(n)]


class Soak:
    def __init__(self, args: argparse.Namespace):
        self.args = args
        base = free_port_range(4)
        self.ports = [base + i for i in range(4)]
        self.backends = [f"http://127.0.0.1:{p}" for p in self.ports]
        self.procs = [start_backend(p) for p in self.ports]
        for u in self.backends:
            wait_healthy(u)
        gw_port = free_port()
        cmd = LB + ["proxy", "--port", str(gw_port), "--router", "least_requests"]
        if args.admission:
            cmd += ["--admission", args.admission]
        for u in self.backends:
            cmd += ["--endpoint", u]
        self.proxy = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.gateway = f"http://127.0.0.1:{gw_port}"
        wait_healthy(self.gateway)
        self.kills: list[dict] = []
        #: the proxy's answers by HTTP status at the end of the replay (``run_soak``)
        self.answered: dict[str, int] = {}
        self.samples: list[dict] = []
        self.stop = threading.Event()
        self.t_start = time.monotonic()

    def client_pids(self) -> list[int]:
        return [os.getpid()] + [p.pid for p in multiprocessing.active_children() if p.name.startswith("lbbench-")]

    def sample(self) -> None:
        pids = self.client_pids()
        text = proxy_metrics(self.gateway)
        self.samples.append({"t_s": round(time.monotonic() - self.t_start, 1),
                             "proxy_rss_mb": round(rss_mb(self.proxy.pid), 1),
                             "client_rss_mb": round(sum(rss_mb(p) for p in pids), 1),
                             "client_processes": len(pids), "proxy_in_flight": in_flight_total(text),
                             "proxy_held": held_at_gateway(text), "load_1m": load_average_1m()})

    def chaos(self) -> None:
        """Sample RSS every ``sample_every`` s; kill and restart one backend every ``kill_every`` minutes."""
        a = self.args
        next_kill = self.t_start + a.kill_every * 60
        next_sample = self.t_start
        k = 0
        while not self.stop.is_set():
            now = time.monotonic()
            if now >= next_sample:
                self.sample()
                next_sample += a.sample_every
            if now >= next_kill:
                i = k % 4
                gauge = in_flight(self.gateway, self.backends[i])
                self.procs[i].send_signal(signal.SIGKILL)
                at = time.monotonic()
                self.procs[i].wait(10)
                self.kills.append({"backend": i, "url": self.backends[i], "at_monotonic_s": at,
                                   "in_flight_before": gauge, "back_after_s": None})
                time.sleep(a.down)
                self.procs[i] = start_backend(self.ports[i])
                try:
                    wait_healthy(self.backends[i], 60)
                    self.kills[-1]["back_after_s"] = round(time.monotonic() - at, 2)
                except RuntimeError:
                    self.kills[-1]["back_after_s"] = None
                k += 1
                next_kill += a.kill_every * 60
            self.stop.wait(0.2)

    def close(self, chaos: threading.Thread | None = None) -> None:
        """Stop the chaos thread first (a restart it is making would otherwise outlive the soak), then every
        process."""
        self.stop.set()
        if chaos is not None:
            chaos.join(90)  # a restart waits at most 60 s for health
        for p in [self.proxy, *self.procs]:
            p.terminate()
        for p in [self.proxy, *self.procs]:
            try:
                p.wait(15)
            except subprocess.TimeoutExpired:
                p.kill()


def is_shed(r) -> bool:
    """A record of a request the proxy's flow control shed (429 on arrival, 503 displaced)."""
    return r.http_status in (429, 503) and r.error is not None and SHED_PREFIX in r.error


def explain(records: list, kills: list[dict], origin_s: float, failure_times: dict[int, float]) -> dict:
    """Attribute each failure to a kill it was in flight for: sent before the kill, its failure seen after it
    (the first such kill); a failure no kill explains is reported."""
    kill_run_s = [k["at_monotonic_s"] - origin_s for k in kills]
    per_kill = [0] * len(kills)
    unexplained = []
    for r in records:
        if r.error is None or is_shed(r):
            continue
        sent = r.actual_send_s if r.actual_send_s is not None else r.arrival_s
        failed = failure_times.get(r.request_id, float("inf"))
        hit = [j for j, t in enumerate(kill_run_s) if sent <= t <= failed]
        if hit:
            per_kill[hit[0]] += 1
        else:
            unexplained.append({"request_id": r.request_id, "actual_send_s": sent, "failed_s": failed,
                                "error": r.error[:160]})
    return {"per_kill": per_kill, "unexplained": unexplained}


def run_soak(args: argparse.Namespace, soak_args: argparse.Namespace, run_id: str) -> tuple:
    """Replay ``args``' workload through the proxy of a ``Soak(soak_args)`` while its chaos thread runs (kills,
    restarts, RSS samples); the soak is closed after, its last sample taken. Returns the soak, the replay's
    result, the requests sent and the load-worker count."""
    reqs = workload(args.rate, args.minutes, args.seed)
    workers = (auto_load_workers(args.rate, os.cpu_count() or 1) if args.load_workers == "auto"
               else int(args.load_workers))
    soak = Soak(soak_args)
    chaos = threading.Thread(target=soak.chaos, daemon=True)
    try:
        chaos.start()
        # no out_dir: the records are streamed to a temporary folder of the result's own (``res.records``)
        res = run_replay(reqs, get_router("round_robin", num_instances=1), [soak.gateway],
                         ReplaySettings(run_id=run_id, seed=args.seed, scrape_interval_s=None, load_workers=workers,
                                        request_timeout_s=120.0, stall_timeout_s=60.0, keep_token_times=False))
        soak.sample()
        soak.answered = answered_by_status(proxy_metrics(soak.gateway))
    finally:
        soak.close(chaos)
    return soak, res, reqs, workers


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--minutes", type=float, default=30.0)
    ap.add_argument("--kill-every", type=float, default=5.0, help="minutes between backend kills")
    ap.add_argument("--down", type=float, default=2.0, help="seconds a killed backend stays down")
    ap.add_argument("--rate", type=float, default=80.0)
    ap.add_argument("--sample-every", type=float, default=30.0, help="seconds between RSS samples")
    ap.add_argument("--warmup", type=float, default=60.0,
                    help="seconds before the first RSS sample growth is measured from (workers started, pools warm)")
    ap.add_argument("--load-workers", default="auto", help="auto (what lbbench run picks) or a count")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=None, help="summary JSON (default: a temporary directory)")
    ap.add_argument("--admission", default=None, metavar="SPEC",
                    help="flow control at the proxy (lbbench proxy --admission SPEC), "
                         "e.g. max_queue=64,max_outstanding=128")
    ap.add_argument("--slope-minutes", type=float, default=20.0,
                    help="the proxy RSS slope is fitted over this many last minutes of the replay")
    args = ap.parse_args()
    soak, res, reqs, workers = run_soak(args, args, "soak")
    ids = [r.request_id for r in res.records]
    shed = [r for r in res.records if is_shed(r)]
    failed = [r for r in res.records if r.error is not None and not is_shed(r)]
    why = explain(res.records, soak.kills, res.clock_origin_s, res.failure_times)
    warm = [x for x in soak.samples if x["t_s"] >= args.warmup] or soak.samples
    first, last = warm[0], soak.samples[-2] if len(soak.samples) > 1 else soak.samples[-1]
    # the backlog while arrivals last (after the last arrival the replay only drains)
    during = [x for x in warm if x["t_s"] <= min(last["t_s"], reqs[-1].arrival_s - args.sample_every / 2)] or warm
    live_ts = [x["t_s"] for x in during]
    sim_in_flight, sim_shed = simulated_in_flight(reqs, live_ts, args.admission)
    live_backlog = [x["proxy_in_flight"] + max(x["proxy_held"], 0) for x in during]
    replay = [x for x in soak.samples if x["t_s"] <= last["t_s"]]
    tail = [x for x in warm if x["t_s"] >= last["t_s"] - args.slope_minutes * 60 and x["t_s"] <= last["t_s"]]
    sends = sorted(r.actual_send_s for r in res.records if r.actual_send_s is not None)
    shed_by_status = Counter(r.http_status for r in shed)
    proxy_shed = {st: soak.answered.get(str(st), 0) for st in (429, 503)}
    loads = [x["load_1m"] for x in replay if x["load_1m"] >= 0]
    summary = {
        "minutes": args.minutes, "rate_per_s": args.rate, "load_workers": workers, "sent": len(reqs),
        "recorded": len(ids), "recorded_twice": len(ids) - len(set(ids)), "complete": res.complete,
        "admission": args.admission, "shed": len(shed),
        "shed_by_status": {str(k): v for k, v in shed_by_status.items()},
        "proxy_answered_by_status": soak.answered, "sim_shed_by_status": {str(k): v for k, v in sim_shed.items()},
        "achieved_send_rate_per_s": round((len(sends) - 1) / (sends[-1] - sends[0]), 2) if len(sends) > 1 else None,
        "load_1m_mean": round(sum(loads) / len(loads), 2) if loads else None, "load_1m_max": max(loads, default=None),
        "cpus": os.cpu_count(),
        "failed": len(failed), "failed_before_first_token": sum(r.first_token_s is None for r in failed),
        "failed_unexplained": len(why["unexplained"]), "unexplained": why["unexplained"][:20],
        "errors": dict(Counter(re.sub(r"\d+", "N", r.error)[:100] for r in failed).most_common(8)),
        "kills": [{**k, "failures": why["per_kill"][j], "at_run_s": round(k["at_monotonic_s"] - res.clock_origin_s, 2)}
                  for j, k in enumerate(soak.kills)],
        "rss": soak.samples,
        "proxy_rss_growth_mb": round(last["proxy_rss_mb"] - first["proxy_rss_mb"], 1),
        "client_rss_growth_mb": round(last["client_rss_mb"] - first["client_rss_mb"], 1),
        "proxy_rss_first_mb": first["proxy_rss_mb"], "proxy_rss_peak_mb": max(x["proxy_rss_mb"] for x in replay),
        "proxy_rss_last_mb": last["proxy_rss_mb"],
        "proxy_rss_tail_slope_mb_per_min": round(slope_per_min([x["t_s"] for x in tail],
                                                               [x["proxy_rss_mb"] for x in tail]), 3),
        "proxy_rss_tail_from_s": tail[0]["t_s"] if tail else None,
        "in_flight_slope_per_min": round(slope_per_min(live_ts, live_backlog), 1),
        "sim_in_flight": dict(zip(map(str, live_ts), sim_in_flight)),
        "sim_in_flight_slope_per_min": round(slope_per_min(live_ts, sim_in_flight), 1),
        "load_worker_lag": res.load_workers,
    }
    out = Path(args.out) if args.out else Path(tempfile.mkdtemp()) / "soak.json"
    out.write_text(json.dumps(summary, indent=1))
    print(f"soak: {args.minutes:g} min at {args.rate:g} req/s through lbbench proxy (4 x serve-sim {PROFILE}, "
          f"{workers} load worker(s), flow control {args.admission or 'off'}); {len(soak.kills)} kills")
    print(f"records: {len(ids)}/{len(reqs)} recorded, {summary['recorded_twice']} twice, complete {res.complete}; "
          f"sent at {summary['achieved_send_rate_per_s']} req/s achieved; host load (1 min) mean "
          f"{summary['load_1m_mean']}, max {summary['load_1m_max']} on {summary['cpus']} cores")
    shed_ok = all(shed_by_status.get(st, 0) == proxy_shed[st] for st in (429, 503))
    by_status = ", ".join(f"{n} x {st}" for st, n in sorted(shed_by_status.items())) or "none"
    print(f"shed: {len(shed)} records ({by_status}); "
          f"the proxy answered {proxy_shed[429]} x 429, {proxy_shed[503]} x 503 "
          f"({'equal' if shed_ok else 'NOT equal'}); the simulator, same requests and flow control, no kills: "
          f"{sum(sim_shed.values())}")
    print(f"failures: {len(failed)} ({summary['failed_before_first_token']} before their first token), "
          f"{summary['failed_unexplained']} not in flight at any kill")
    for err, n in summary["errors"].items():
        print(f"  {n} x {err}")
    for k in summary["kills"]:
        print(f"  kill of backend {k['backend']} at {k['at_run_s']:.1f} s: gauge read {k['in_flight_before']} in "
              f"flight just before, {k['failures']} client failures, back after {k['back_after_s']} s")
    print("RSS (MB), requests in flight and held at the proxy, host load over time: "
          "t_s proxy client in-flight held load (simulator's in flight + held)")
    sim_at = dict(zip(live_ts, sim_in_flight))
    for s in soak.samples:
        sim = sim_at.get(s["t_s"])
        print(f"  {s['t_s']:8.1f} {s['proxy_rss_mb']:8.1f} {s['client_rss_mb']:8.1f} {s['proxy_in_flight']:6d} "
              f"{s['proxy_held']:5d} {s['load_1m']:5.2f}" + (f" ({sim})" if sim is not None else ""))
    print(f"backlog after warm-up: in flight + held grows {summary['in_flight_slope_per_min']:+.1f}/min live, "
          f"{summary['sim_in_flight_slope_per_min']:+.1f}/min in the simulator (same requests, no kills)")
    print(f"RSS growth from {first['t_s']:.0f} s to {last['t_s']:.0f} s: proxy {summary['proxy_rss_growth_mb']:+.1f} MB, client "
          f"{summary['client_rss_growth_mb']:+.1f} MB (target <= 50 MB over 30 minutes)")
    print(f"proxy RSS: first {first['proxy_rss_mb']:.1f}, peak {summary['proxy_rss_peak_mb']:.1f}, last "
          f"{last['proxy_rss_mb']:.1f} MB; slope {summary['proxy_rss_tail_slope_mb_per_min']:+.3f} MB/min over the "
          f"samples from {summary['proxy_rss_tail_from_s']} s (the last {args.slope_minutes:g} minutes)")
    for w in res.load_workers:
        print(f"  load worker {w['worker']}: {w['requests']} requests, dispatch lag p50 {w['lag_p50_ms']:.2f} / "
              f"p99 {w['lag_p99_ms']:.2f} ms")
    ok = (len(ids) == len(reqs) == len(set(ids)) and not why["unexplained"] and shed_ok
          and all(k["failures"] <= max(k["in_flight_before"], 0) + 5 for k in summary["kills"]))
    print(f"summary: {out}; target (nothing lost, every shed request a record counted as the proxy counted it, only "
          f"requests in flight on a killed backend fail): {'met' if ok else 'missed'}")


if __name__ == "__main__":
    main()
