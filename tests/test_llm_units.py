"""llm.py against the scripted OpenAI-compatible server, in this process: retries and their waits, and which
endpoint a request's override names (the routes: test_request_endpoints.py, test_keys_and_access.py)."""

from __future__ import annotations

import email.utils
import logging
import time
from dataclasses import replace

import httpx2
import openai
import pytest

from hugginggpt.config import LLMSettings
from hugginggpt.errors import BadRequest, DeadlineExceeded, Forbidden, LLMError
from hugginggpt.llm import (
    UNREACHABLE_ENDPOINT,
    DeadlineLLM,
    LLMClient,
    _backoff,
    _pins,
    _retry_after,
    _short,
    check_api_key,
    check_request_endpoint,
    normalize_endpoint,
    with_overrides,
)
from hugginggpt.urlpolicy import UrlPolicy

HI = [{"role": "user", "content": "hi"}]


def client_of(llm, **settings) -> LLMClient:
    return LLMClient(LLMSettings(api_type="local", endpoint=llm.base_url + "/v1", model="scripted", **settings))


def hosted_client_of(llm, **settings) -> LLMClient:
    """An OpenAI-type client on the scripted server: retries a call that timed out (a local one does not)."""
    return LLMClient(LLMSettings(api_type="openai", endpoint=llm.base_url + "/v1", api_key="sk-test-0123456789",
                                 model="scripted", **settings))


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
    client = hosted_client_of(llm, max_retries=1, timeout=1.0)
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


# --- What a user sees of llm.py's pure parts: each expected value below is written by hand. ---

KEY = "sk-secret-0123456789abcdef"


def status_error(status: int, headers: dict[str, str] | None = None, body=None, text: str = "",
                 message: str = "Error code") -> openai.APIStatusError:
    """The SDK's own exception for an HTTP answer, around a real httpx2 response."""
    request = httpx2.Request("POST", "http://127.0.0.1:8006/v1/chat/completions")
    response = httpx2.Response(status, headers=headers or {}, text=text, request=request)
    return openai.APIStatusError(message, response=response, body=body)


def test_retry_after_reads_milliseconds_seconds_and_http_dates_capped_at_a_minute():
    assert _retry_after(status_error(429, {"retry-after-ms": "250"})) == 0.25
    assert _retry_after(status_error(429, {"Retry-After-Ms": "120000"})) == 60.0  # capped
    assert _retry_after(status_error(429, {"retry-after-ms": "soon"})) is None  # junk: the backoff decides
    assert _retry_after(status_error(429, {"retry-after": "7"})) == 7.0
    assert _retry_after(status_error(429, {"Retry-After": "7.5"})) == 7.5
    assert _retry_after(status_error(429, {"retry-after": "0"})) == 0.0
    assert _retry_after(status_error(429, {"retry-after": "-5"})) == 0.0  # negative: no wait, not a negative one
    assert _retry_after(status_error(429, {"retry-after-ms": "-5000"})) == 0.0  # time.sleep(-5) would raise
    assert _retry_after(status_error(429, {"retry-after": "3600"})) == 60.0
    assert _retry_after(status_error(429, {"retry-after": "1e9"})) == 60.0
    assert _retry_after(status_error(429, {"retry-after": "soon"})) is None
    assert _retry_after(status_error(429, {})) is None
    assert _retry_after(status_error(503, {"retry-after-ms": "20", "retry-after": "9"})) == 0.02  # ms first
    in_30s = email.utils.formatdate(time.time() + 30, usegmt=True)
    assert 28.0 <= _retry_after(status_error(503, {"retry-after": in_30s})) <= 30.0
    in_2h = email.utils.formatdate(time.time() + 7200, usegmt=True)
    assert _retry_after(status_error(503, {"retry-after": in_2h})) == 60.0
    an_hour_ago = email.utils.formatdate(time.time() - 3600, usegmt=True)
    assert _retry_after(status_error(503, {"retry-after": an_hour_ago})) == 0.0


def test_backoff_doubles_from_half_a_second_up_to_eight_with_up_to_a_quarter_off():
    bounds = {0: (0.375, 0.5), 1: (0.75, 1.0), 2: (1.5, 2.0), 3: (3.0, 4.0), 4: (6.0, 8.0), 5: (6.0, 8.0),
              9: (6.0, 8.0)}
    for tries, (low, high) in bounds.items():
        waits = [_backoff(tries) for _ in range(300)]
        assert all(low <= w <= high for w in waits), (tries, min(waits), max(waits))
        assert max(waits) - min(waits) > (high - low) / 2  # jittered over the range, not one value


def test_short_takes_the_error_message_from_the_body_then_the_text_then_the_exception():
    assert _short(status_error(400, body={"error": {"message": "bad model"}}, text="from text")) == "bad model"
    assert _short(status_error(400, body={"error": {"message": "m" * 400}})) == "m" * 300
    assert _short(status_error(400, body={"error": "e" * 400}, text="from text")) == "e" * 300
    assert _short(status_error(400, body={"message": "top level"}, text="from text")) == "top level"
    assert _short(status_error(400, body={"error": {"code": 1}}, text="  one\n two\t three  ")) == "one two three"
    assert _short(status_error(400, body=None, text="w " * 400)) == ("w " * 150)[:300]
    assert _short(status_error(400, body="a string body", text="from text")) == "from text"
    assert _short(status_error(400, body=None, text="   ", message="first line\nsecond")) == "first line"
    assert _short(ValueError("first line\nsecond line")) == "first line"
    assert _short(ValueError("x" * 400)) == "x" * 300
    assert _short(ValueError()) == "ValueError"
    assert _short(openai.APIConnectionError(request=httpx2.Request("GET", "http://h/"))) == "Connection error."


def test_messages_render_for_a_completion_model_exactly(llm):
    client = client_of(llm, use_completion=True)
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]
    assert client.chat(messages) == "CHITCHAT: hi"
    body = llm.requests[-1]["body"]
    assert body["prompt"] == "<im_start>system\nbe brief<im_end>\n<im_start>user\nhi<im_end>\n<im_start>assistant\n"
    assert body["max_tokens"] == 2048 and body["model"] == "scripted" and body["temperature"] == 0.0
    client.chat(messages, max_tokens=50)
    assert llm.requests[-1]["body"]["max_tokens"] == 50


def test_a_completion_model_streams_its_pieces_and_reports_its_usage(llm):
    client = client_of(llm, use_completion=True)
    pieces: list[str] = []
    usage: list[dict] = []
    assert client.chat(HI, on_token=pieces.append) == "CHITCHAT: hi"
    assert pieces == ["CHITCHAT: ", "hi"]  # the server's pieces, as they came
    streamed = llm.requests[-1]
    assert streamed["body"]["stream"] is True and streamed["path"].startswith("/v1/completions")
    assert client.chat(HI, on_usage=usage.append) == "CHITCHAT: hi"
    assert usage == [{"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}]
    assert "stream" not in llm.requests[-1]["body"]


def test_a_completion_call_is_bounded_by_its_deadline_and_its_timeout(llm):
    client = client_of(llm, use_completion=True, timeout=30.0)
    llm.on("chitchat", "late", delay=1.5)
    try:
        started = time.monotonic()
        with pytest.raises(DeadlineExceeded):
            client.chat(HI, deadline=time.monotonic() + 0.4)
        assert time.monotonic() - started < 1.4  # cut off, not the 1.5 s answer
        slow = client_of(llm, use_completion=True, timeout=0.4, max_retries=0)
        started = time.monotonic()
        with pytest.raises(LLMError, match=r"^the configured LLM \(local, model scripted\) timed out after 0.4s \(not retried: "):
            slow.chat(HI)
        assert time.monotonic() - started < 1.4  # cut off, not the 1.5 s answer
    finally:
        llm.reset()


def test_an_azure_backend_is_called_at_its_deployment_with_its_version_and_key(llm):
    client = LLMClient(LLMSettings(api_type="azure", api_key="az-key-7", endpoint=llm.base_url, model="gpt",
                                   azure_deployment="planner-dep", azure_api_version="2025-01-01-preview"))
    assert client.chat(HI) == "CHITCHAT: hi"
    call = llm.requests[-1]
    assert call["path"] == "/openai/deployments/planner-dep/chat/completions?api-version=2025-01-01-preview"
    assert call["headers"].get("Api-Key") == "az-key-7" and "Authorization" not in call["headers"]


def test_a_request_endpoint_is_checked_with_a_one_line_reason():
    refusals = {
        123: "api_endpoint must be a string URL",
        "http://h/" + "a" * 2040: "api_endpoint is longer than 2048 characters",
        "http://h/a b": "api_endpoint must not contain spaces or control characters",
        "http://h/a\x01b": "api_endpoint must not contain spaces or control characters",
        "http://h/a\x7fb": "api_endpoint must not contain spaces or control characters",
        "http://h\u00e9.example/v1": "api_endpoint must be ASCII (write an international domain name in its xn-- form)",
        "ftp://h/v1": "api_endpoint must be an http(s) URL",
        "h:8006/v1": "api_endpoint must be an http(s) URL",
        "http://h:99999/v1": "api_endpoint is not a valid URL (Port out of range 0-65535)",
        "http:///v1": "api_endpoint has no host",
        "http://h:0/v1": "api_endpoint has an invalid port",
        "http://user@h/v1": "api_endpoint must not carry credentials; send the key as api_key",
        "http://:pw@h/v1": "api_endpoint must not carry credentials; send the key as api_key",
    }
    for url, reason in refusals.items():
        with pytest.raises(BadRequest) as caught:
            check_request_endpoint(url)
        assert str(caught.value) == reason, url
    assert check_request_endpoint("  http://h:8006/v1  ") == "http://h:8006/v1"
    assert check_request_endpoint("HTTPS://h/v1") == "HTTPS://h/v1"
    longest = "http://h/" + "a" * (2048 - 9)
    assert check_request_endpoint(longest) == longest  # 2048 characters: still accepted


def test_an_api_key_must_be_printable_ascii_without_spaces():
    with pytest.raises(BadRequest) as caught:
        check_api_key(12345)
    assert str(caught.value) == "api_key must be a string"
    for bad in ("sk-a b", "\u201csk-abc\u201d", "sk-abc\x7f", "sk-\u00e9t\u00e9", "sk-abc\t"):
        with pytest.raises(BadRequest) as caught:
            check_api_key(bad)
        assert str(caught.value) == ("api_key has characters an HTTP header cannot carry (curly quotes, spaces, "
                                     "non-ASCII letters?); paste the key again as plain text"), bad
        assert bad not in str(caught.value)
    check_api_key("!sk-~abc")  # the printable ends, 0x21 and 0x7E, are fine
    check_api_key("")


def test_an_endpoint_is_normalized_to_its_v1_base():
    assert normalize_endpoint("http://h:8006") == "http://h:8006/v1"
    assert normalize_endpoint("http://h:8006/") == "http://h:8006/v1"
    assert normalize_endpoint(" http://h:8006/v1/ ") == "http://h:8006/v1"
    assert normalize_endpoint("http://h:8006/v1/chat/completions") == "http://h:8006/v1"
    assert normalize_endpoint("http://h:8006/v1/completions/") == "http://h:8006/v1"
    assert normalize_endpoint("https://h/api/openai/PREFIX") == "https://h/api/openai/PREFIX"
    assert normalize_endpoint("http://h/v1?x=1#frag") == "http://h/v1"
    with pytest.raises(BadRequest) as caught:
        normalize_endpoint("ftp://h/v1")
    assert str(caught.value) == "api_endpoint must be an http(s) URL, got 'ftp://h/v1'"


def test_a_request_s_endpoint_is_pinned_to_the_address_its_policy_checked():
    def pins_of(endpoint: str, address: str | None = "10.0.0.5"):
        return _pins(LLMSettings(api_type="local", endpoint=endpoint, endpoint_address=address))

    assert pins_of("https://LLM.example/v1") == {("llm.example", 443): "10.0.0.5"}
    assert pins_of("http://llm.example/v1") == {("llm.example", 80): "10.0.0.5"}
    assert pins_of("http://llm.example:8006/v1") == {("llm.example", 8006): "10.0.0.5"}
    assert pins_of("https://llm.example:8443/v1") == {("llm.example", 8443): "10.0.0.5"}
    assert pins_of("http://llm.example/v1", address=None) is None  # a configured endpoint: looked up as usual
    assert _pins(LLMSettings(api_type="openai", endpoint=None, endpoint_address="10.0.0.5")) is None


def resolving(host: str, address: str = "127.0.0.1") -> UrlPolicy:
    """The URL policy with `host` allowed by name and looked up to `address` (no DNS in tests)."""
    return UrlPolicy.from_entries([host], resolver=lambda name, port: [address])


CONFIGURED = LLMSettings(api_type="local", api_key="sk-configured-0123456789", endpoint="http://127.0.0.1:8006",
                         model="m", url_allowlist=("127.0.0.1",))


def test_overrides_change_only_what_the_request_names_and_refuse_the_rest_with_a_reason():
    same = with_overrides(CONFIGURED, model="other", api_type="openai")
    assert (same.model, same.api_type, same.api_key, same.trusted) == ("other", "openai",
                                                                         "sk-configured-0123456789", True)
    assert with_overrides(CONFIGURED, api_key="sk-mine-0123456789").api_key == "sk-mine-0123456789"
    assert with_overrides(CONFIGURED) == CONFIGURED
    refusals = [
        (dict(api_type="bogus"), "api_type must be one of openai, azure, local, got 'bogus'"),
        (dict(api_key="sk-\u201cquoted\u201d"), "api_key has characters an HTTP header cannot carry (curly "
                                                "quotes, spaces, non-ASCII letters?); paste the key again as plain text"),
        (dict(api_endpoint="ftp://127.0.0.1/v1"), "api_endpoint must be an http(s) URL"),
    ]
    for kwargs, reason in refusals:
        with pytest.raises(BadRequest) as caught:
            with_overrides(CONFIGURED, **kwargs)
        assert str(caught.value) == reason
    with pytest.raises(Forbidden) as caught:
        with_overrides(CONFIGURED, api_endpoint="http://127.0.0.1:9999/v1", allow_endpoints=False)
    assert str(caught.value) == ("this server does not accept `api_endpoint` in requests "
                                 "(allow_request_endpoints is false in its config)")


def test_no_backend_configured_each_request_names_its_own():
    none = LLMSettings(api_type=None)
    assert with_overrides(none, api_key="sk-mine-0123456789").api_type == "openai"
    named = with_overrides(none, api_endpoint="http://127.0.0.1:8006/v1", policy=resolving("127.0.0.1"))
    assert (named.api_type, named.endpoint, named.api_key) == ("local", "http://127.0.0.1:8006/v1", None)
    for kwargs, reason in [
        (dict(api_type="local"), "api_type 'local' needs api_endpoint (e.g. http://localhost:8006/v1)"),
        (dict(), "no API key for the openai backend: send api_key or configure one"),
        (dict(api_type="azure"), "no API key for the azure backend: send api_key or configure one"),
    ]:
        with pytest.raises(BadRequest) as caught:
            with_overrides(none, **kwargs)
        assert str(caught.value) == reason
    assert with_overrides(LLMSettings(api_type="local", endpoint="http://127.0.0.1:8006")).api_key is None


def test_the_configured_key_never_goes_to_an_endpoint_a_request_names():
    foreign = with_overrides(CONFIGURED, api_endpoint="http://127.0.0.1:9999/v1/")  # allowed by url_allowlist
    assert (foreign.endpoint, foreign.api_key, foreign.trusted, foreign.endpoint_address) == \
        ("http://127.0.0.1:9999/v1", None, False, "127.0.0.1")
    own = with_overrides(CONFIGURED, api_endpoint="http://127.0.0.1:9999", api_key="sk-mine-0123456789")
    assert (own.api_key, own.trusted) == ("sk-mine-0123456789", False)
    hosted = LLMSettings(api_type="openai", api_key="sk-configured-0123456789")
    keyless = with_overrides(hosted, api_endpoint="http://llm.test:9999/v1", policy=resolving("llm.test", "10.1.2.3"))
    assert (keyless.api_key, keyless.endpoint_address, keyless.api_type) == (None, "10.1.2.3", "openai")
    with pytest.raises(LLMError) as caught:  # loopback, not in the url_allowlist
        with_overrides(LLMSettings(api_type="local", endpoint="http://10.0.0.1:8006"),
                       api_endpoint="http://127.0.0.1:9999/v1")
    assert str(caught.value) == UNREACHABLE_ENDPOINT


def test_an_azure_endpoint_is_kept_as_the_resource_url_without_v1():
    azure = LLMSettings(api_type="azure", api_key="azure-key-0123", endpoint="https://res.example.com",
                        azure_deployment="dep")
    same = with_overrides(azure, api_endpoint=" https://res.example.com/ ", allow_endpoints=False)
    assert (same.endpoint, same.trusted, same.api_key) == ("https://res.example.com", True, "azure-key-0123")
    other = with_overrides(CONFIGURED, api_type="azure", api_endpoint="https://other.example.com//",
                           api_key="azure-key-4567", policy=resolving("other.example.com", "10.9.8.7"))
    assert (other.endpoint, other.api_type, other.endpoint_address) == ("https://other.example.com", "azure",
                                                                        "10.9.8.7")
    with pytest.raises(BadRequest) as caught:
        with_overrides(azure, api_endpoint="ftp://res.example.com")
    assert str(caught.value) == "api_endpoint must be an http(s) URL"
    portal = replace(azure, endpoint="https://res.example.com/")  # as the Azure portal shows it
    same = with_overrides(portal, api_endpoint="https://res.example.com", allow_endpoints=False)
    assert (same.trusted, same.api_key) == (True, "azure-key-0123")  # the configured endpoint, not a foreign one


def test_an_endpoint_with_an_upper_case_scheme_is_taken_as_its_check_accepts_it():
    local = LLMSettings(api_type="local", endpoint="http://10.0.0.1:8006")
    named = with_overrides(local, api_endpoint="HTTP://10.0.0.1:8006/v1/chat/completions", allow_endpoints=False)
    assert named.endpoint == "http://10.0.0.1:8006" and named.trusted  # the configured one, said differently
    azure = LLMSettings(api_type="azure", api_key="azure-key-0123", endpoint="https://res.example.com")
    assert with_overrides(azure, api_endpoint="HTTPS://res.example.com", allow_endpoints=False).trusted


def test_a_request_s_endpoint_is_connected_at_its_checked_address_not_looked_up_again(llm):
    base = LLMSettings(api_type="local", endpoint="http://10.0.0.1:8006", model="scripted")
    named = with_overrides(base, api_endpoint=llm.base_url.replace("127.0.0.1", "llm.test") + "/v1", policy=resolving("llm.test"))
    client = LLMClient(named)
    assert client.chat(HI) == "CHITCHAT: hi"  # llm.test resolves nowhere: only the pin reaches loopback
    assert client.describe == "the LLM at the request's api_endpoint (local, model scripted)"


def test_a_client_without_a_kind_takes_it_from_its_settings_and_sends_a_placeholder_key(llm):
    client = LLMClient(LLMSettings(api_type=None, endpoint=llm.base_url + "/v1", model="scripted"))
    assert client.describe == "the configured LLM (local, model scripted)"
    assert client.chat(HI) == "CHITCHAT: hi"
    assert llm.requests[-1]["headers"].get("Authorization") == "Bearer not-needed"
    hosted = LLMClient(LLMSettings(api_type="openai", api_key=KEY, model="gpt-4o-mini"))
    assert hosted.describe_for_log == "the configured LLM (openai, model gpt-4o-mini) at https://api.openai.com/v1"


def test_an_error_body_is_shown_from_the_configured_llm_with_every_key_redacted(llm):
    for key, body, shown in [
        (KEY, "invalid key {key} given", "invalid key *** given"),
        ("key-0123456789", "invalid key {key} given", "invalid key *** given"),
        ("abcd", "the key abcd is revoked", "the key *** is revoked"),
        (KEY, "also sk-OTHER_Key-42xyz leaked", "also sk-*** leaked"),
    ]:
        llm.reset()
        llm.failure_body = body
        llm.fail(401)
        client = client_of(llm, api_key=key, max_retries=0)
        with pytest.raises(LLMError) as caught:
            client.chat(HI)
        assert str(caught.value) == f"the configured LLM (local, model scripted) answered HTTP 401: {shown}"
        assert key not in str(caught.value)


def test_an_endpoint_the_request_named_gets_no_echo_of_its_error_body(llm):
    llm.failure_body = "internal service says: {key}"
    llm.fail(404)
    named = with_overrides(LLMSettings(api_type="local", endpoint="http://10.0.0.1:8006", model="scripted"),
                           api_endpoint=llm.base_url + "/v1", api_key=KEY, policy=resolving("127.0.0.1"))
    with pytest.raises(LLMError) as caught:
        LLMClient(named).chat(HI)
    assert str(caught.value) == "the LLM at the request's api_endpoint (local, model scripted) answered HTTP 404"


def test_408_409_429_and_5xx_are_retried_and_the_wait_is_what_the_llm_asked(llm, caplog):
    client = client_of(llm, max_retries=3)
    for status in (408, 409, 429, 500, 502):
        llm.reset()
        llm.fail(status)
        assert client.chat(HI) == "CHITCHAT: hi", status
    llm.reset()
    llm.fail(500, 503, 500)
    caplog.clear()
    started = time.monotonic()
    with caplog.at_level(logging.WARNING, logger="hugginggpt.llm"):
        assert client.chat(HI) == "CHITCHAT: hi"
    assert time.monotonic() - started < 0.6  # three waits of 10 ms as asked, not backoffs of 0.4 + 0.75 + 1.5 s
    retries = [r.getMessage() for r in caplog.records if "retrying" in r.getMessage()]
    assert [m.split(": retrying in ")[1] for m in retries] == ["0.0s (attempt 2 of 4)", "0.0s (attempt 3 of 4)",
                                                                "0.0s (attempt 4 of 4)"]
    assert retries[0].startswith("the configured LLM (local, model scripted) at http://127.0.0.1:")
    for status in (400, 401, 404, 410, 422):
        llm.reset()
        llm.fail(status)
        with pytest.raises(LLMError, match=f"answered HTTP {status}: scripted failure {status}$"):
            client.chat(HI)
        assert len(llm.requests) == 1, status  # asked once: no retry


def test_a_retry_that_would_end_past_the_deadline_is_not_waited_for(llm):
    llm.failure_body = "busy"  # no retry-after-ms: the backoff, at least 0.375 s
    llm.fail(503)
    client = client_of(llm, max_retries=3)
    started = time.monotonic()
    with pytest.raises(DeadlineExceeded) as caught:
        client.chat(HI, deadline=time.monotonic() + 0.3)
    assert str(caught.value) == "the configured LLM (local, model scripted) kept failing until the request's deadline"
    assert time.monotonic() - started < 0.25
    with pytest.raises(DeadlineExceeded) as caught:
        client.chat(HI, deadline=time.monotonic() - 1)
    assert str(caught.value) == "the request's deadline passed before the configured LLM (local, model scripted) answered"
    assert client.chat(HI, deadline=time.monotonic() + 0.8) == "CHITCHAT: hi"  # under a second left: still asked


def test_a_page_that_is_not_a_completion_is_named_as_such(llm):
    llm.raw_reply = "<html>hello</html>"
    with pytest.raises(LLMError) as caught:
        client_of(llm).chat(HI)
    assert str(caught.value) == ("the configured LLM (local, model scripted) answered with something that is not "
                                 "an OpenAI-style completion (is api_endpoint the /v1 base of an OpenAI-compatible "
                                 "server?)")


def test_structured_output_falls_back_form_by_form_or_fails_with_its_status(llm, caplog):
    schema = {"type": "object", "required": ["tasks"]}
    llm.rejects_schema = {"json_schema"}
    client = client_of(llm)
    assert client.chat(HI, json_schema=schema) == "CHITCHAT: hi"
    assert [r["body"]["response_format"] for r in llm.requests] == [
        {"type": "json_schema", "json_schema": {"name": "plan", "schema": schema, "strict": True}},
        {"type": "json_object", "schema": schema}]
    assert client.schema_format == 1
    llm.reset()
    llm.rejects_schema = True
    with pytest.raises(LLMError) as caught:
        client_of(llm).chat(HI, json_schema=schema, structured="on")
    assert str(caught.value) == ("the configured LLM (local, model scripted) does not accept structured output "
                                 "(response_format json_schema or json_object with a schema, HTTP 400); "
                                 "set structured_output: auto or off")
    free = client_of(llm)
    caplog.clear()  # the refusal above logged its own line
    with caplog.at_level(logging.INFO, logger="hugginggpt.llm"):
        assert free.chat(HI, json_schema=schema) == "CHITCHAT: hi" and free.schema_format == 2
    assert [r.getMessage() for r in caplog.records if r.name == "hugginggpt.llm"] == [
        "the configured LLM (local, model scripted) rejects structured output; planning in free text from now on"]
    assert "response_format" not in llm.requests[-1]["body"]
    asked = len(llm.requests)
    assert free.chat(HI, json_schema=schema) == "CHITCHAT: hi"
    assert len(llm.requests) == asked + 1  # a rejected form is never asked again
    with pytest.raises(LLMError) as caught:  # nothing asked, so no status to tell
        free.chat(HI, json_schema=schema, structured="on")
    assert str(caught.value) == ("the configured LLM (local, model scripted) does not accept structured output "
                                 "(response_format json_schema or json_object with a schema); "
                                 "set structured_output: auto or off")
    llm.reset()
    llm.fail(400)  # a 400 without response_format asked is the LLM's error, not a rejected schema
    with pytest.raises(LLMError, match="answered HTTP 400: scripted failure 400$"):
        client_of(llm).chat(HI)


def test_a_failing_token_sink_s_own_error_comes_out_unchanged(llm):
    seen: list[str] = []

    def sink(piece: str) -> None:
        seen.append(piece)
        raise BadRequest("the client went away")

    with pytest.raises(BadRequest, match="^the client went away$"):
        client_of(llm).chat([{"role": "user", "content": "one two three"}], on_token=sink)
    assert seen == ["CHITCHAT: "]
    pieces: list[str] = []
    assert client_of(llm).chat(HI, on_token=pieces.append) == "CHITCHAT: hi" and pieces == ["CHITCHAT: ", "hi"]


def test_a_request_s_view_adds_up_token_usage_and_tells_each_call_s_outcome(llm):
    observed: list[tuple] = []
    view = DeadlineLLM(client_of(llm), deadline=time.monotonic() + 30,
                       observe=lambda kind, ok, seconds, usage: observed.append((kind, ok, seconds, usage)))
    assert view.chat(HI) == "CHITCHAT: hi" and view.chat(HI) == "CHITCHAT: hi"
    assert view.usage == {"prompt_tokens": 2, "completion_tokens": 2}
    llm.fail(400)
    with pytest.raises(LLMError):
        view.chat(HI)
    assert view.usage == {"prompt_tokens": 2, "completion_tokens": 2}
    assert [(kind, ok, usage) for kind, ok, _, usage in observed] == [
        ("local", True, {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}),
        ("local", True, {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}),
        ("local", False, None),
    ]
    assert all(0 <= seconds < 5 for _, _, seconds, _ in observed)
    assert view.settings.model == "scripted" and view.describe == "the configured LLM (local, model scripted)"


def test_a_reply_with_empty_content_is_an_empty_text(llm):
    llm.on("chitchat", "")
    assert client_of(llm).chat(HI) == ""


def test_an_unreachable_llm_is_named_by_kind_and_a_request_s_own_one_tells_nothing_of_why():
    import socket

    with socket.socket() as s:  # a port with nothing behind it
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    configured = LLMSettings(api_type="local", endpoint=f"http://127.0.0.1:{port}/v1", model="m", max_retries=2)
    with pytest.raises(LLMError) as caught:
        LLMClient(configured).chat(HI)
    assert str(caught.value) == "the configured LLM (local, model m) is unreachable (connection failed)"
    named = with_overrides(LLMSettings(api_type="local", endpoint="http://10.0.0.1:8006", model="m"),
                           api_endpoint=f"http://127.0.0.1:{port}/v1", policy=resolving("127.0.0.1"))
    with pytest.raises(LLMError) as caught:
        LLMClient(named).chat(HI)
    assert str(caught.value) == UNREACHABLE_ENDPOINT


def test_an_attempt_that_times_out_is_not_retried_past_max_retries(llm):
    llm.on("chitchat", "late", delay=1.0)
    started = time.monotonic()
    with pytest.raises(LLMError) as caught:
        hosted_client_of(llm, max_retries=0, timeout=0.6).chat(HI)
    assert str(caught.value) == "the configured LLM (openai, model scripted) timed out after 0.6s"  # not rounded to 1s
    assert time.monotonic() - started < 0.95  # one attempt of 0.6 s, no second one
    assert len(llm.requests) == 1


def test_an_llm_that_keeps_writing_without_answering_is_cut_at_the_deadline(llm):
    llm.dribble = 0.1  # a byte every 0.1 s, never an answer
    for on_token in (None, [].append):  # streamed or not: its comments and spaces are no answer
        started = time.monotonic()
        with pytest.raises(DeadlineExceeded) as caught:
            client_of(llm, timeout=5.0).chat(HI, on_token=on_token, deadline=time.monotonic() + 0.5)
        assert str(caught.value) == "the configured LLM (local, model scripted) did not answer before the request's deadline"
        assert time.monotonic() - started < 1.0


def test_a_plain_500_to_a_schema_is_retried_in_the_same_form(llm):
    schema = {"type": "object"}
    client = client_of(llm)
    llm.fail(500)  # a plain 500: retried with the same form
    assert client.chat(HI, json_schema=schema) == "CHITCHAT: hi" and client.schema_format == 0
    assert [r["body"]["response_format"]["type"] for r in llm.requests] == ["json_schema", "json_schema"]


def test_usage_is_counted_for_structured_calls_too(llm):
    view = DeadlineLLM(client_of(llm), deadline=None)
    assert view.chat(HI, json_schema={"type": "object"}) == "CHITCHAT: hi"
    assert view.usage == {"prompt_tokens": 1, "completion_tokens": 1}


def test_the_client_cache_keeps_up_to_its_limit_and_uses_its_proxy(llm):
    from hugginggpt.llm import ClientCache

    cache = ClientCache(limit=2)
    a, b, c = (LLMSettings(api_type="local", endpoint=llm.base_url + "/v1", model=name) for name in "abc")
    first = cache.get(a)
    cache.get(b)
    cache.get(c)  # a third client: still kept (the cache is cleared only when it holds more than its limit)
    assert cache.get(a) is first
    cache.get(LLMSettings(api_type="local", endpoint=llm.base_url + "/v1", model="d"))  # four > 2: cleared
    assert cache.get(a) is not first
    import socket

    with socket.socket() as s:  # a proxy nobody answers at: every call goes through it, so none gets through
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(LLMError, match="unreachable"):
        ClientCache(proxy=f"http://127.0.0.1:{port}").get(a).chat(HI)
    assert llm.requests == []


@pytest.fixture(scope="module")
def canned():
    """A loopback OpenAI-compatible server answering each model with a canned body (what the scripted LLM cannot
    say: an error event inside a stream, usage in a stream, an empty choice list)."""
    import json

    from flask import Flask, Response, request

    from tests.fakes.llm_server import ThreadedServer

    def sse(*events) -> str:
        return "".join(f"data: {json.dumps(e) if not isinstance(e, str) else e}\n\n" for e in events)

    def piece(text):
        return {"choices": [{"index": 0, "delta": {"content": text}}]}

    answers = {
        "error-event": sse(piece("par"), {"error": {"message": "overloaded, key sk-ABCDEF123456 refused"}}),
        "bare-error-event": sse({"error": {"code": 7}}),
        "usage-stream": sse(piece("one "), {"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 1}},
                            piece("two"),
                            {"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 2}}, "[DONE]"),
        "odd-chunks": sse({"object": "ping"}, {"choices": []}, {"choices": ["x"]}, piece("ok"), "[DONE]"),
        "no-choices": {"choices": []},
        "odd-choice": {"choices": ["not an object"]},
    }
    app = Flask("canned-llm")

    @app.post("/v1/chat/completions")
    def chat():
        answer = answers[request.get_json(force=True)["model"]]
        if isinstance(answer, str):
            return Response(answer, mimetype="text/event-stream")
        return Response(json.dumps(answer), mimetype="application/json")

    server = ThreadedServer(app).start()
    yield server.url + "/v1"
    server.stop()


def canned_client(url: str, model: str, **settings) -> LLMClient:
    return LLMClient(LLMSettings(api_type="local", endpoint=url, model=model, max_retries=0, **settings))


def test_an_error_event_inside_a_stream_is_the_llm_s_failure_with_keys_redacted(canned):
    with pytest.raises(LLMError) as caught:
        canned_client(canned, "error-event").chat(HI, on_token=[].append)
    assert str(caught.value) == "the configured LLM (local, model error-event) failed: overloaded, key sk-*** refused"
    with pytest.raises(LLMError) as caught:
        canned_client(canned, "bare-error-event").chat(HI, on_token=[].append)
    assert str(caught.value) == ("the configured LLM (local, model bare-error-event) failed: An error occurred "
                                 "during streaming")
    named = with_overrides(LLMSettings(api_type="local", endpoint="http://10.0.0.1:8006", model="error-event",
                                       max_retries=0), api_endpoint=canned, policy=resolving("127.0.0.1"))
    with pytest.raises(LLMError) as caught:
        LLMClient(named).chat(HI, on_token=[].append)
    assert str(caught.value) == "the LLM at the request's api_endpoint (local, model error-event) failed: APIError"


def test_a_streamed_answer_s_last_usage_is_the_total_and_odd_chunks_are_skipped(canned):
    pieces: list[str] = []
    view = DeadlineLLM(canned_client(canned, "usage-stream"), deadline=None)
    assert view.chat(HI, on_token=pieces.append) == "one two" and pieces == ["one ", "two"]
    assert view.usage == {"prompt_tokens": 3, "completion_tokens": 2}
    assert canned_client(canned, "odd-chunks").chat(HI, on_token=pieces.append) == "ok"


def test_an_answer_without_choices_or_with_an_odd_one(canned):
    with pytest.raises(LLMError) as caught:
        canned_client(canned, "no-choices").chat(HI)
    assert str(caught.value) == "the configured LLM (local, model no-choices) returned no choices"
    assert canned_client(canned, "odd-choice").chat(HI) == ""


def test_a_bad_port_is_quoted_in_the_reason_cut_to_80_characters():
    with pytest.raises(BadRequest) as caught:
        check_request_endpoint("http://h:" + "a" * 100 + "/v1")
    assert str(caught.value) == ("api_endpoint is not a valid URL (Port could not be cast to integer value as '"
                                 + "a" * 36 + ")")
    azure = LLMSettings(api_type="azure", api_key="azure-key-0123", endpoint="https://LLM.EXAMPLE.BOX")
    assert with_overrides(azure, api_endpoint="https://LLM.EXAMPLE.BOX/", allow_endpoints=False).trusted


def test_structured_output_off_asks_in_free_text(llm):
    client = client_of(llm)
    assert client.chat(HI, json_schema={"type": "object"}, structured="off") == "CHITCHAT: hi"
    assert "response_format" not in llm.requests[-1]["body"] and client.schema_format == 0


@pytest.mark.parametrize(("error", "said"), [
    ({"message": "the model ran out of memory", "type": "server_error"}, "the model ran out of memory"),
    ({"message": "", "code": 500}, "An error occurred during streaming"),
    ("overloaded", "An error occurred during streaming"),
])
def test_an_error_event_in_a_stream_fails_the_call_with_its_message(llm, error, said):
    llm.stream_error = error
    pieces: list[str] = []
    try:
        with pytest.raises(LLMError) as caught:
            client_of(llm, max_retries=0).chat(HI, on_token=pieces.append)
    finally:
        llm.reset()
    assert pieces == ["CHITCHAT: "]  # what came before the error was shown as it came
    assert said in str(caught.value)


def test_a_stream_that_stalls_is_cut_off_by_its_timeout_or_its_deadline(llm):
    llm.stall = 1.5  # the first piece at once, the second after a pause that outlasts both limits
    try:
        started = time.monotonic()
        with pytest.raises(LLMError) as caught:
            client_of(llm, max_retries=0, timeout=0.4).chat(HI, on_token=lambda piece: None)
        assert str(caught.value).startswith("the configured LLM (local, model scripted) timed out after 0.4s (not retried")
        with pytest.raises(DeadlineExceeded) as late:
            client_of(llm, max_retries=0).chat(HI, on_token=lambda piece: None, deadline=time.monotonic() + 0.5)
        assert str(late.value) == ("the configured LLM (local, model scripted) did not answer before the request's "
                                   "deadline")
        assert time.monotonic() - started < 2.5
    finally:
        llm.reset()
