"""Live tier: `lbbench proxy` in front of two real vLLM CPU instances (tiny model): the stock OpenAI client,
streaming and not, and an lbbench replay through the gateway, every request answered in full."""

from __future__ import annotations

import pytest

from harness.conftest import poisson_requests
from harness.test_live_vllm import _vllm_python_or_skip
from lbbench.engines.vllm.emulator import free_port_range
from lbbench.engines.vllm.launcher import launch
from lbbench.harness.replay import ReplaySettings, run_replay
from lbbench.harness.text_prompts import endpoint_counter, prompt_length_mismatches, texts_for
from lbbench.proxy.gateway import GatewayThread, ProxyConfig
from lbbench.routers import get_router

pytestmark = pytest.mark.live
openai = pytest.importorskip("openai")


def test_proxy_in_front_of_real_vllm(tmp_path):
    _vllm_python_or_skip()
    with launch("tiny", 2, log_dir=tmp_path / "logs", port_base=free_port_range(2),
                extra_args=["--no-enable-prefix-caching"]) as urls:
        cfg = ProxyConfig(backends=urls, router=get_router("least_requests", num_instances=2, seed=0))
        with GatewayThread(cfg) as gw:
            client = openai.OpenAI(base_url=gw.url + "/v1", api_key="none")
            assert client.models.list().data[0].id == "tiny"
            c = client.completions.create(model="tiny", prompt="route me", max_tokens=8,
                                          extra_body={"min_tokens": 8, "ignore_eos": True})
            assert c.usage.completion_tokens == 8
            chunks = list(client.completions.create(model="tiny", prompt="route me", max_tokens=8, stream=True,
                                                    stream_options={"include_usage": True},
                                                    extra_body={"min_tokens": 8, "ignore_eos": True}))
            assert chunks[-1].usage.completion_tokens == 8
            chat = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi"}],
                                                  max_tokens=6, extra_body={"min_tokens": 6, "ignore_eos": True})
            assert chat.usage.completion_tokens == 6
            reqs = poisson_requests(24, 6.0, prompt=(16, 200), output=(4, 24))
            res = run_replay(reqs, get_router("round_robin", num_instances=1, seed=0), [gw.url],
                             ReplaySettings(run_id="lp", seed=0, scrape_interval_s=None))
            # text prompts, as for a gateway that takes only text: exact lengths by vLLM's own /tokenize
            texts, inexact = texts_for(reqs, endpoint_counter(urls[0], "tiny"))
            text_res = run_replay(reqs, get_router("round_robin", num_instances=1, seed=0), [gw.url],
                                  ReplaySettings(run_id="lt", seed=0, scrape_interval_s=None, prompt_texts=texts))
    assert res.complete and all(r.error is None for r in res.records), [r.error for r in res.records if r.error]
    assert all(r.generated_tokens == r.output_tokens for r in res.records)
    assert text_res.complete and inexact == 0
    assert prompt_length_mismatches(text_res.frame()) == 0
    assert all(r.server_prompt_tokens == r.prompt_tokens for r in text_res.records)
