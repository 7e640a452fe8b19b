"""Whose failure a hosted call's error is, and what the user reads (backends/failures.py), and where each request
of a hosted call goes (backends/hubclient.py): in-process, on the errors huggingface_hub itself raises for the
Hub's real answers (its own `hf_raise_for_status` on an httpx2 response), not on look-alikes."""

from __future__ import annotations

import httpx2
import pytest
from huggingface_hub.errors import InferenceTimeoutError
from huggingface_hub.utils import hf_raise_for_status

from hugginggpt.backends.failures import (
    INVALID_TOKEN,
    Failure,
    from_http,
    hub_failure,
    one_line,
    provider_failure,
    status_of,
    timed_out,
    token_refused,
)
from hugginggpt.backends.hubclient import (
    FILE,
    HUB,
    ROUTER,
    HostedCall,
    ProviderFileError,
    ProviderFiles,
    canonical,
    hosted_call,
    on_request,
)
from hugginggpt.urlpolicy import UrlPolicy

MODEL = "acme/model"
TOKEN = "hf_failures_unit_token"
HUB_API = f"https://huggingface.co/api/models/{MODEL}"


def hub_error(status: int, url: str = HUB_API, **headers: str) -> Exception:
    """What huggingface_hub raises for the Hub answering `status` at `url`."""
    response = httpx2.Response(status, headers=headers, json={"error": "x"}, request=httpx2.Request("GET", url))
    with pytest.raises(Exception) as info:
        hf_raise_for_status(response)
    return info.value


def chained(inner: BaseException) -> BaseException:
    outer = ValueError("wrapped")
    outer.__cause__ = inner
    return outer


# -- the Hub -------------------------------------------------------------------------------------------------------


def test_a_revoked_token_is_the_accounts_refusal_named_once_in_one_line():
    exc = hub_error(401, **{"X-Error-Message": INVALID_TOKEN})
    assert token_refused(exc) and token_refused(chained(exc))
    failure = hub_failure(exc, MODEL, 3.0, "line")
    assert failure == Failure("unauthorized", "the Hugging Face Hub refused huggingface.token (401 Unauthorized: the "
                                              "token is revoked, expired or mistyped): set a valid token in "
                                              "huggingface.token or HUGGINGFACE_ACCESS_TOKEN "
                                              "(https://huggingface.co/settings/tokens)", True, True)
    assert failure.account


def test_a_401_for_a_repository_the_hub_does_not_show_is_no_such_model_not_a_bad_token():
    exc = hub_error(401)  # the Hub's 401 without the message: a missing, private or gated repository
    assert not token_refused(exc)
    assert hub_failure(exc, MODEL, 3.0, "x") == Failure(
        "error", f"{MODEL} is not on the Hub (or is private or gated for this token)", answered=True)
    assert hub_failure(hub_error(404), MODEL, 3.0, "x").answered
    assert not token_refused(hub_error(402)) and not token_refused(hub_error(403))
    other = hub_error(401, url="https://huggingface.co/api/whoami-v2", **{"X-Error-Message": "Expired"})
    assert not token_refused(other)  # a 401 saying something else is no refusal of the token


@pytest.mark.parametrize("status, outcome, line", [
    (429, "rate_limited", f"the Hugging Face Hub is rate-limiting this server (429 Too Many Requests) while looking "
                          f"up the providers of {MODEL}; try again in a minute"),
    (500, "error", f"the Hugging Face Hub failed (500) while looking up the providers of {MODEL}: the line"),
    (503, "unavailable", f"the Hugging Face Hub failed (503) while looking up the providers of {MODEL}: the line"),
])
def test_the_hub_failing_is_the_hubs_and_no_answer(status, outcome, line):
    failure = hub_failure(hub_error(status), MODEL, 3.0, "the line")
    assert failure == Failure(outcome, line)
    assert not failure.final and not failure.answered and not failure.account


def test_a_silent_or_unreachable_hub():
    request = httpx2.Request("GET", HUB_API)
    assert hub_failure(httpx2.ReadTimeout("slow", request=request), MODEL, 2.5, "x") == Failure(
        "timeout", f"the Hugging Face Hub did not answer within 2.5s while looking up the providers of {MODEL}; "
                   "try again")
    assert hub_failure(httpx2.ConnectError("refused", request=request), MODEL, 3.0, "the line") == Failure(
        "error", f"the Hugging Face Hub could not be reached to look up the providers of {MODEL}: the line")


def test_only_an_http_exchange_makes_a_failure_the_hubs():
    assert from_http(hub_error(500)) and from_http(chained(hub_error(500)))
    assert from_http(httpx2.ReadTimeout("slow")) and from_http(chained(httpx2.ConnectError("x")))
    assert not from_http(ValueError(f"Model '{MODEL}' doesn't support task 'text-to-image'."))
    assert not from_http(None)
    looped = ValueError("loop")
    looped.__context__ = looped
    assert not from_http(looped)
    context = ValueError("outer")
    context.__context__ = hub_error(429)
    assert from_http(context)


# -- the provider and its file host ------------------------------------------------------------------------------


def router_error(status: int) -> Exception:
    return hub_error(status, url="https://router.huggingface.co/fal-ai/x")


@pytest.mark.parametrize("status, outcome, final, line", [
    (401, "unauthorized", True, "fal-ai refused the Hugging Face token (401 Unauthorized): check huggingface.token or "
                                "HUGGINGFACE_ACCESS_TOKEN (a fine-grained token needs the permission to make calls to "
                                "Inference Providers)"),
    (402, "out_of_credits", True, "the Hugging Face account has no Inference Providers credits left (402 Payment "
                                  "Required from fal-ai): add credits at https://huggingface.co/settings/billing, or "
                                  "run the task on the local models server (inference_mode: hybrid)"),
    (429, "rate_limited", False, "fal-ai is rate-limiting this token (429 Too Many Requests): wait a minute, or allow "
                                 "more providers in huggingface.providers"),
    (503, "unavailable", False, f"fal-ai cannot serve {MODEL} right now (503 Service Unavailable: the model is loading "
                                "or the provider is overloaded); try again in a minute"),
    (500, "error", False, "fal-ai failed (500): the line"),
])
def test_each_provider_status_is_one_line(status, outcome, final, line):
    failure = provider_failure(router_error(status), "fal-ai", MODEL, 60.0, float("inf"), "the line")
    assert failure == Failure(outcome, line, final)
    assert failure.account is (status in (401, 402))


def test_a_provider_error_without_a_status():
    assert provider_failure(ValueError("odd"), "fal-ai", MODEL, 60.0, 10.0, "odd") == Failure(
        "error", "fal-ai failed: odd")


def test_timeouts_ours_the_deadlines_and_the_providers_own():
    slow = httpx2.ReadTimeout("slow")
    assert provider_failure(slow, "fal-ai", MODEL, 60.0, 10.0, "x") == Failure(
        "timeout", "fal-ai timed out (no answer for 60s)")
    assert provider_failure(InferenceTimeoutError("slow"), "fal-ai", MODEL, 7.0, 10.0, "x") == Failure(
        "timeout", "fal-ai timed out (no answer for 7s)")
    at_deadline = provider_failure(slow, "fal-ai", MODEL, 60.0, 0.0, "x")
    assert at_deadline == Failure("timeout", "fal-ai timed out (the deadline passed)", True)
    assert not at_deadline.account  # final, but no refusal of the account
    waited = TimeoutError("Inference request timed out after 60 seconds.")
    assert provider_failure(waited, "replicate", MODEL, 120.0, 10.0, "Inference request timed out after 60 seconds.") \
        == Failure("timeout", "replicate timed out: Inference request timed out after 60 seconds.")
    assert timed_out(chained(waited)) and not timed_out(ValueError("x")) and not timed_out(None)


@pytest.mark.parametrize("status", [401, 403, 404, 410])
def test_a_file_link_refused_by_its_host_reads_as_expired(status):
    failure = provider_failure(ProviderFileError("fetching ... failed", status=status), "fal-ai", MODEL, 60.0, 10.0, "x")
    assert failure == Failure("error", f"the provider's file link expired or was refused (HTTP {status} from fal-ai's "
                                       f"file host): the output of {MODEL} could not be fetched; try again")


def test_other_file_failures_name_the_file():
    assert provider_failure(ProviderFileError("x", status=500), "fal-ai", MODEL, 60.0, 10.0, "the line") == Failure(
        "error", f"fal-ai's output file of {MODEL} could not be fetched: the line")
    assert provider_failure(ProviderFileError("x", refused=True), "fal-ai", MODEL, 60.0, 10.0, "loopback") == Failure(
        "error", "fal-ai returned an output file the URL policy refuses: loopback")
    slow = ProviderFileError("took longer", slow=True)
    assert provider_failure(slow, "fal-ai", MODEL, 60.0, 10.0, "x") == Failure(
        "timeout", f"fal-ai's output file of {MODEL} was not fetched in time: x")
    assert provider_failure(slow, "fal-ai", MODEL, 60.0, 0.05, "x").final
    under_a_timeout = ProviderFileError("x", status=403)
    under_a_timeout.__context__ = httpx2.ReadTimeout("slow")  # its own cause is no provider timeout
    assert provider_failure(chained(under_a_timeout), "fal-ai", MODEL, 60.0, 10.0, "x").line.startswith(
        "the provider's file link expired")


def test_status_of_and_one_line():
    assert status_of(chained(router_error(502))) == 502 and status_of(ValueError("x")) is None
    assert one_line(ValueError(f" first {TOKEN} https://u:p@host.example/x?token=abc\nsecond"), TOKEN) == (
        "first *** https://***@host.example/x?token=***")
    assert one_line(ValueError("x" * 400), None) == "x" * 300
    assert one_line(ValueError(""), None) == "ValueError"


# -- where each request of a hosted call goes --------------------------------------------------------------------


def test_urls_compare_as_sent():
    assert canonical("https://Router.Example.com:443/") == "https://router.example.com"
    assert canonical("http://h.example:80/a/b/?q=1") == "http://h.example/a/b"
    assert canonical("http://h.example:8080/a") == "http://h.example:8080/a"
    assert canonical("http://[::1]:9/x") == "http://[::1]:9/x"
    assert canonical("not a url/") == "not a url" and canonical("http://") == "http:"


def call(**kw) -> HostedCall:
    kw.setdefault("moves", (("https://router.huggingface.co", "http://127.0.0.1:7"),
                            ("https://huggingface.co", "http://127.0.0.1:8/hub")))
    kw.setdefault("token", TOKEN)
    return HostedCall(router="http://127.0.0.1:7", hub="http://127.0.0.1:8/hub", policy=UrlPolicy(), max_bytes=1000,
                      timeout=5.0, **kw)


def sent(request: httpx2.Request) -> httpx2.Request:
    on_request(request)
    return request


def test_the_hubs_api_before_the_router_gets_the_configured_token_and_nothing_else_does():
    with hosted_call(call()) as c:
        lookup = sent(httpx2.Request("GET", f"https://huggingface.co/api/models/{MODEL}",
                                     headers={"Authorization": "Bearer hf_stale"}))
        assert str(lookup.url) == f"http://127.0.0.1:8/hub/api/models/{MODEL}" and c.last == HUB
        assert lookup.headers["Authorization"] == f"Bearer {TOKEN}" and not c.routed
        routed = sent(httpx2.Request("POST", "https://router.huggingface.co/fal-ai/x",
                                     headers={"Authorization": "Bearer mine"}))
        assert c.last == ROUTER and c.routed and routed.headers["Authorization"] == "Bearer mine"
        after = sent(httpx2.Request("GET", f"https://huggingface.co/api/models/{MODEL}"))
        assert c.last == FILE and "Authorization" not in after.headers  # a URL a provider handed back
        cdn = sent(httpx2.Request("GET", "https://v3.fal.media/files/x.png"))
        assert c.last == FILE and str(cdn.url) == "https://v3.fal.media/files/x.png"
    with hosted_call(call(token=None)) as c:
        anonymous = sent(httpx2.Request("GET", f"https://huggingface.co/api/models/{MODEL}",
                                        headers={"Authorization": "Bearer hf_stale"}))
        assert c.last == HUB and "Authorization" not in anonymous.headers
    outside = sent(httpx2.Request("GET", f"https://huggingface.co/api/models/{MODEL}"))
    assert str(outside.url) == f"https://huggingface.co/api/models/{MODEL}"  # outside a hosted call: untouched


class Inner(httpx2.BaseTransport):
    def __init__(self):
        self.sent: list[str] = []
        self.closed = False

    def handle_request(self, request: httpx2.Request) -> httpx2.Response:
        self.sent.append(str(request.url))
        return httpx2.Response(200, content=b"inner")

    def close(self) -> None:
        self.closed = True


def test_the_transport_sends_the_router_and_hub_on_and_refuses_files_the_policy_refuses():
    inner = Inner()
    files = ProviderFiles(inner)
    with hosted_call(call()) as c:
        c.last = ROUTER
        assert files.handle_request(httpx2.Request("POST", "http://127.0.0.1:7/fal-ai/x")).content == b"inner"
        c.last = FILE
        with pytest.raises(ProviderFileError) as refused:
            files.handle_request(httpx2.Request("GET", "http://127.0.0.1:9/files/secret.txt"))
        assert refused.value.refused and "loopback address 127.0.0.1" in str(refused.value)
        with pytest.raises(ProviderFileError, match="a POST to a provider's file host is not sent"):
            files.handle_request(httpx2.Request("POST", "https://v3.fal.media/files/x"))
    assert files.handle_request(httpx2.Request("GET", "http://127.0.0.1:9/x")).content == b"inner"  # no call: on
    assert inner.sent == ["http://127.0.0.1:7/fal-ai/x", "http://127.0.0.1:9/x"]
    files.close()
    assert inner.closed


def test_the_edges():
    from types import SimpleNamespace

    looped = ValueError("loop")
    looped.__context__ = looped
    assert not timed_out(looped) and status_of(looped) is None
    bare = SimpleNamespace(response=SimpleNamespace(status_code=401), __cause__=None, __context__=None)
    assert token_refused(bare)  # a 401 with no headers at all: the token
    slow = httpx2.ReadTimeout("slow")
    assert provider_failure(slow, "fal-ai", MODEL, 60.0, 0.05, "x").final
    assert not provider_failure(slow, "fal-ai", MODEL, 60.0, 0.051, "x").final
    late_file = ProviderFileError("x", slow=True)
    assert provider_failure(late_file, "fal-ai", MODEL, 60.0, 0.05, "x").final
    assert not provider_failure(late_file, "fal-ai", MODEL, 60.0, 0.051, "x").final
    said = SimpleNamespace(server_message="from the server\nmore", __str__=None)
    assert one_line(said, None) == "from the server"
    assert one_line(ValueError(" \n "), None) == "ValueError"


def test_a_library_origin_is_moved_however_it_is_spelled():
    moved = call(moves=(("https://HuggingFace.co:443/", "http://127.0.0.1:8/hub/"),))
    with hosted_call(moved) as c:
        lookup = sent(httpx2.Request("GET", f"https://huggingface.co/api/models/{MODEL}?expand=inferenceProviderMapping"))
        assert str(lookup.url) == f"http://127.0.0.1:8/hub/api/models/{MODEL}?expand=inferenceProviderMapping"
        assert lookup.headers["Host"] == "127.0.0.1:8" and c.last == HUB
        other = sent(httpx2.Request("GET", "https://huggingface.com/api/models/x"))
        assert str(other.url) == "https://huggingface.com/api/models/x" and c.last == FILE
