"""The gateway's Prometheus metrics: counters, per-backend gauges and latency histograms, rendered as text."""

from __future__ import annotations

import bisect

#: histogram bucket upper bounds, seconds
BUCKETS_S = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)


class Histogram:
    def __init__(self) -> None:
        self.counts = [0] * (len(BUCKETS_S) + 1)
        self.total_s = 0.0
        self.n = 0

    def observe(self, value_s: float) -> None:
        self.counts[bisect.bisect_left(BUCKETS_S, value_s)] += 1
        self.total_s += value_s
        self.n += 1

    def render(self, name: str, help_text: str) -> str:
        lines = [f"# HELP {name} {help_text}", f"# TYPE {name} histogram"]
        cum = 0
        for le, c in zip(BUCKETS_S, self.counts):
            cum += c
            lines.append(f'{name}_bucket{{le="{le}"}} {cum}')
        lines.append(f'{name}_bucket{{le="+Inf"}} {self.n}')
        lines += [f"{name}_sum {self.total_s}", f"{name}_count {self.n}"]
        return "\n".join(lines) + "\n"


class ProxyMetrics:
    def __init__(self, backends: list[str]):
        self.backends = backends
        self.requests: dict[str, int] = {}
        self.in_flight = [0] * len(backends)
        self.healthy = [1] * len(backends)
        self.decisions = 0
        self.deferrals = 0
        self.latency = Histogram()
        self.ttft = Histogram()

    def count(self, status: str) -> None:
        self.requests[status] = self.requests.get(status, 0) + 1

    def observe_done(self, latency_s: float, ttft_s: float) -> None:
        self.latency.observe(latency_s)
        self.ttft.observe(ttft_s)

    def render(self, queue_depth: int) -> str:
        out = ["# HELP lbbench_proxy_requests_total Requests answered, by HTTP status (aborted: cut mid-stream).",
               "# TYPE lbbench_proxy_requests_total counter"]
        out += [f'lbbench_proxy_requests_total{{status="{s}"}} {n}' for s, n in sorted(self.requests.items())]
        out += ["# HELP lbbench_proxy_backend_in_flight Requests in flight per backend.",
                "# TYPE lbbench_proxy_backend_in_flight gauge"]
        out += [f'lbbench_proxy_backend_in_flight{{backend="{b}"}} {n}' for b, n in zip(self.backends, self.in_flight)]
        out += ["# HELP lbbench_proxy_backend_healthy 1 when the backend answers /health.",
                "# TYPE lbbench_proxy_backend_healthy gauge"]
        out += [f'lbbench_proxy_backend_healthy{{backend="{b}"}} {h}' for b, h in zip(self.backends, self.healthy)]
        out += ["# HELP lbbench_proxy_router_decisions_total Router calls.",
                "# TYPE lbbench_proxy_router_decisions_total counter",
                f"lbbench_proxy_router_decisions_total {self.decisions}",
                "# HELP lbbench_proxy_router_deferrals_total Router calls that deferred.",
                "# TYPE lbbench_proxy_router_deferrals_total counter",
                f"lbbench_proxy_router_deferrals_total {self.deferrals}",
                "# HELP lbbench_proxy_queue_depth Requests waiting at the gateway for the router.",
                "# TYPE lbbench_proxy_queue_depth gauge",
                f"lbbench_proxy_queue_depth {queue_depth}"]
        return ("\n".join(out) + "\n"
                + self.latency.render("lbbench_proxy_request_duration_seconds", "End-to-end latency at the gateway.")
                + self.ttft.render("lbbench_proxy_time_to_first_byte_seconds", "Time to the first streamed byte."))
