"""llm.py against the scripted OpenAI-compatible server, in this process: retries and their waits, and which
endpoint a request's override names (the routes: test_request_endpoints.py, test_keys_and_access.py)."""

from __future__ import annotations

import time

import pytest

from hugginggpt.config import LLMSettings
from hugginggpt.errors import Forbidden, LLMError
from hugginggpt.llm import LLMClient, with_overrides

HI = [{"role": "user", "content": "hi"}]


def client_of(llm, **settings) -> LLMClient:
    return LLMClient(LLMSettings(api_type="local", endpoint=llm.base_url + "/v1", model="scripted", **settings))


def test_a_failing_llm_is_tried_max_retries_plus_one_times_waiting_what_it_asks(llm):
    client = client_of(llm, max_retries=2)
    llm.fail(500, 503, 500, 500)  # each answer asks for a retry after 10 ms (retry-after-ms)
    started = time.monotonic()
    with pytest.raises(LLMError):
        client.chat(HI)
    assert time.monotonic() - started < 3.0  # milliseconds as asked: read as seconds, it would wait 20 s
    assert llm.failures == [500]  # three tries (the first and two retries); the fourth failure never asked for
    llm.reset()
    llm.fail(429)
    assert client.chat(HI)  # one retry after a 429 answers


def test_a_request_naming_the_configured_endpoint_in_another_spelling_is_the_configured_endpoint():
    settings = LLMSettings(api_type="local", api_key="sk-configured-0123456789", endpoint="http://127.0.0.1:8006",
                           model="m")
    for spelled in ("http://127.0.0.1:8006/v1", "http://127.0.0.1:8006/v1/chat/completions",
                    "http://127.0.0.1:8006/v1/"):
        same = with_overrides(settings, api_endpoint=spelled, allow_endpoints=False)  # not refused as foreign
        assert same.trusted and same.api_key == "sk-configured-0123456789"
    with pytest.raises(Forbidden, match="allow_request_endpoints is false"):
        with_overrides(settings, api_endpoint="http://127.0.0.1:9999/v1", allow_endpoints=False)


def test_under_a_request_deadline_a_retryable_failure_is_retried(llm):
    client = client_of(llm, max_retries=2)
    llm.fail(503)
    assert client.chat(HI, deadline=time.monotonic() + 30) == "CHITCHAT: hi"  # the deadline is on the same clock
    assert llm.failures == []


def test_under_a_request_deadline_each_attempt_still_ends_at_llm_timeout(llm):
    client = client_of(llm, max_retries=1, timeout=1.0)
    llm.on("chitchat", "slow answer", delay=4.0, times=1)  # the first attempt hangs; the retry answers
    started = time.monotonic()
    assert client.chat(HI, deadline=time.monotonic() + 60) == "CHITCHAT: hi"
    assert time.monotonic() - started < 3.5  # 1 s, the retry's wait, its answer: not the hung attempt's 4 s


def test_an_llm_nobody_answers_at_is_refused_at_once_not_after_backoffs():
    import socket

    with socket.socket() as s:  # a port with nothing behind it
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    client = LLMClient(LLMSettings(api_type="local", endpoint=f"http://127.0.0.1:{port}/v1", model="m",
                                   max_retries=3))
    started = time.monotonic()
    with pytest.raises(LLMError, match="unreachable|refused|connect"):
        client.chat(HI)
    assert time.monotonic() - started < 1.0  # three backoffs would take 2.6 s at least


def test_each_request_s_own_key_reaches_the_llm_through_the_client_cache(llm):
    from hugginggpt.llm import ClientCache

    cache = ClientCache()
    base = LLMSettings(api_type="local", endpoint=llm.base_url + "/v1", model="scripted")
    for key in ("sk-alice-0123456789", "sk-bob-9876543210", "sk-alice-0123456789"):
        cache.get(with_overrides(base, api_key=key)).chat(HI)
    sent = [r["headers"].get("Authorization") for r in llm.requests]
    assert sent == ["Bearer sk-alice-0123456789", "Bearer sk-bob-9876543210", "Bearer sk-alice-0123456789"]
    assert cache.get(with_overrides(base, api_key="sk-bob-9876543210")) is \
        cache.get(with_overrides(base, api_key="sk-bob-9876543210"))  # one client per settings, kept
