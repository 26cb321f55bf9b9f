"""Prefill/decode fleet, live against the simulator: the pair routers on `lbbench run --fleet` with roles
(simulated, ``lbbench.sim.disagg``) and on `lbbench serve-sim --fleet` with roles + `lbbench run --endpoints`
(emulated instances speaking llm-d's P/D sidecar protocol, real HTTP streams, the KV transfer waited on the wall
clock), the same requests on both sides.

    python bench/pd_live_vs_sim.py --out runs/pd-live            # 1P+2D A100, 4 pair routers, 3 live repeats

The method is ``mixed_live_vs_sim.py``'s (sim once per repeat between live repeats, the live router order rotated,
medians of the live repeats, the host's load average before each); this adds the P/D defaults and the targets:
the live ranking of the pair routers equals the simulator's, and each router's live mean E2E is within 10 % of the
simulator's. Routers whose simulated means are within ``TIE`` of each other are a tie (on one prefill instance the
published policies all pick it, and differ only in the decode instance): the ranking is checked on the other pairs.
"""

from __future__ import annotations

import statistics

from mixed_live_vs_sim import arguments, live_vs_sim

#: simulated means closer than this (relative) are a tie
TIE = 0.03


def main() -> None:
    ap = arguments(fleet="llama3.1-8b-a100:1:prefill,llama3.1-8b-a100:2:decode",
                   routers="pd_llmd,pd_dynamo,pd_vllm,pd_joint", prompt_tokens="2000:0.5", output_tokens="64:0.5",
                   rate="6", requests="90", kv_link="rdma-400g")
    ap.set_defaults(repeats=3)
    doc = live_vs_sim(ap.parse_args())
    sim = {row["router"]: row["sim"]["mean_e2e_s"] for row in doc["rows"]}
    live = {row["router"]: statistics.median(x["mean_e2e_s"] for x in row["live"]) for row in doc["rows"]}
    worst = max(abs(live[r] - sim[r]) / sim[r] for r in sim)
    pairs = [(a, b) for a in sim for b in sim if sim[a] < sim[b] * (1 - TIE)]  # a clearly ahead of b in the sim
    wrong = [(a, b) for a, b in pairs if not live[a] < live[b]]
    print(f"largest |live - sim| / sim of mean E2E: {100 * worst:.1f} % (target <= 10 %)")
    print(f"ranking: {len(pairs) - len(wrong)} of {len(pairs)} pairs the simulator separates by > {100 * TIE:.0f} % "
          f"in the same order live{'' if not wrong else f'; reversed: {wrong}'}")


if __name__ == "__main__":
    main()
