"""Hosted inference as users meet it (issue 46): what real accounts and networks do, against a fake Hub, router and
file host that behave as the real ones do (tests/fakes/router_server.py): a revoked token refused on every call,
the Hub failing or slow, huggingface_hub's own lookups of the provider mapping, provider file links that point at
loopback, private or huge files or have expired, replicate's `Prefer: wait` running out, and what the request
sees of all this (the selection's reason, no replan after the account was refused, events, the tried list)."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
import requests
from PIL import Image

from hugginggpt.backends import HostedFailure, ModelStatus, TaskInputs
from hugginggpt.backends.hosted import HostedInference
from hugginggpt.resources import resolve
from hugginggpt.select import Availability
from hugginggpt.urlpolicy import UrlPolicy, system_resolver
from tests.conftest import sse, start_server, stop_server, write_config
from tests.fakes.llm_server import ThreadedServer
from tests.fakes.router_server import FakeRouter, Served

TOKEN = "hf_as_met_token"
STALE = "hf_stale_token_left_by_hf_auth_login"  # what `hf auth login` left in HF_HOME, since revoked
FLUX = "black-forest-labs/FLUX.1-schnell"
WHISPER = "openai/whisper-large-v3"
CAPTIONER = "microsoft/git-base-coco"
REFUSED = ("the Hugging Face Hub refused huggingface.token (401 Unauthorized: the token is revoked, expired or "
           "mistyped): set a valid token in huggingface.token or HUGGINGFACE_ACCESS_TOKEN")
SECRET = b"internal: the admin password is hunter2"


def serve_models(fake: FakeRouter) -> None:
    fake.models.clear()
    fake.serve(FLUX, "text-to-image", Served("replicate", "black-forest-labs/flux-schnell", "text-to-image"),
               Served("fal-ai", "fal-ai/flux/schnell", "text-to-image"))
    fake.serve(WHISPER, "automatic-speech-recognition",
               Served("replicate", "openai/whisper:8099696689d249cf8b122d833c36ac3f75505c666a395ca40ef26f68e7d3d16e",
                      "automatic-speech-recognition"))
    for n in range(12):  # models no other test (nor huggingface_hub's lookup cache) has seen: one per test
        fake.serve(f"acme/fresh-{n}", "text-to-image", Served("fal-ai", f"fal-ai/fresh-{n}", "text-to-image"),
                   Served("replicate", f"acme/fresh-{n}", "text-to-image"))
        fake.serve(f"acme/fresh-hf-{n}", "text-to-image", Served("hf-inference", f"acme/fresh-hf-{n}", "text-to-image"))
    fake.serve(CAPTIONER, "image-to-text", Served("hf-inference", CAPTIONER, "image-to-text"))
    fake.preferences[TOKEN] = ["fal-ai", "replicate", "hf-inference"]


@pytest.fixture(scope="module")
def servers():
    fake = FakeRouter()
    serve_models(fake)
    router = ThreadedServer(fake.app()).start()
    cdn = ThreadedServer(fake.cdn_app()).start()
    yield fake, router.url, cdn.url
    router.stop()
    cdn.stop()


@pytest.fixture
def fake(servers):
    fake, _, _ = servers
    fake.reset()
    serve_models(fake)
    return fake


@pytest.fixture
def urls(servers):
    _, router, cdn = servers
    return router, cdn


def cdn_named(cdn_url: str) -> str:
    """The file host under a public-looking name (cdn.test, resolved to it by the test's policy)."""
    return cdn_url.replace("127.0.0.1", "cdn.test")


def policy() -> UrlPolicy:
    """url_allowlist: [cdn.test], with cdn.test resolving to loopback where the fake file host listens."""
    return UrlPolicy.from_entries(["cdn.test"], resolver=lambda host, port: (
        ["127.0.0.1"] if host == "cdn.test" else system_resolver(host, port)))


def backend(router: str, public: Path, **kw) -> HostedInference:
    kw.setdefault("status_ttl", 0)
    kw.setdefault("url_policy", policy())
    return HostedInference(kw.pop("token", TOKEN), public, router_url=router, hub_url=router, **kw)


def draw(text: str = "a lighthouse") -> TaskInputs:
    return TaskInputs("text-to-image", text=text)


# -- 1. a revoked or mistyped token ------------------------------------------------------------------------------


def test_a_revoked_token_is_named_as_such_logged_once_and_never_sent_to_a_provider(fake, urls, public_dir, caplog):
    router, _ = urls
    fake.revoked.add(TOKEN)
    hosted = backend(router, public_dir)
    with caplog.at_level(logging.INFO, logger="hugginggpt"):
        for _ in range(3):
            assert hosted.model_status(FLUX) == ModelStatus(False, REFUSED + " (https://huggingface.co/settings/tokens)")
        with pytest.raises(HostedFailure) as info:
            hosted.infer(FLUX, draw())
    assert str(info.value).startswith(REFUSED) and info.value.final is True  # the account's: no other model tried
    assert fake.calls == []  # no provider was asked
    logged = [r.getMessage() for r in caplog.records if "refused huggingface.token" in r.getMessage()]
    assert len(logged) == 1, logged  # once per token, not per task
    assert TOKEN not in caplog.text


# -- 2. the Hub failing or slow, and providers the config leaves out ---------------------------------------------


@pytest.mark.parametrize("status, says", [
    (500, "the Hugging Face Hub failed (500) while looking up the providers of " + FLUX),
    (503, "the Hugging Face Hub failed (503) while looking up the providers of " + FLUX),
    (429, "the Hugging Face Hub is rate-limiting this server (429 Too Many Requests) while looking up the providers of "
          + FLUX),
])
def test_the_hub_failing_is_named_logged_and_asked_again_next_time(fake, urls, public_dir, caplog, status, says):
    router, _ = urls
    fake.hub_status = status
    hosted = backend(router, public_dir, status_ttl=60)
    availability = Availability({"huggingface": hosted}, ttl=60)  # status_cache_seconds: 60
    with caplog.at_level(logging.WARNING, logger="hugginggpt"):
        found, why = availability.check_why([FLUX], ["huggingface"])
    assert found == {"huggingface": []} and why[FLUX].startswith(says), why
    assert any(says in r.getMessage() for r in caplog.records)
    fake.hub_status = None  # the Hub is back: the failure was not remembered as "unavailable"
    assert availability.check_why([FLUX], ["huggingface"]) == ({"huggingface": [FLUX]}, {})


def test_a_silent_hub_is_named_as_slow(fake, urls, public_dir):
    router, _ = urls
    fake.hangs["hub"] = 3
    status = backend(router, public_dir, status_timeout=0.5).model_status(FLUX)
    assert status == ModelStatus(False, f"the Hugging Face Hub did not answer within 0.5s while looking up the "
                                        f"providers of {FLUX}; try again", lasting=False)


def test_a_model_served_only_by_providers_the_config_leaves_out_says_so(fake, urls, public_dir):
    router, _ = urls
    status = backend(router, public_dir, providers=("hf-inference", "together")).model_status(FLUX)
    assert status == ModelStatus(False, f"{FLUX} is served only by fal-ai, replicate, which huggingface.providers "
                                        "(hf-inference, together) leaves out")
    assert backend(router, public_dir).model_status("acme/nowhere") == ModelStatus(
        False, "acme/nowhere is not on the Hub (or is private or gated for this token)")


# -- 3. huggingface_hub's own lookups ----------------------------------------------------------------------------


def test_huggingface_hubs_own_lookup_carries_the_configured_token(fake, urls, public_dir):
    """hf-inference's client looks the model up on the Hub again with HfApi(), whose token is whatever HF_HOME holds
    (in a test run: none). The Hub rate-limits anonymous callers: the lookup must carry huggingface.token."""
    router, _ = urls
    fake.anonymous_status = 429
    result = backend(router, public_dir).infer("acme/fresh-hf-0", draw())
    assert result["provider"] == "hf-inference"
    calls = [c for c in fake.hub_calls if c["model"] == "acme/fresh-hf-0"]
    assert len(calls) == 2 and {c["token"] for c in calls} == {TOKEN}  # ours and the library's


def test_the_mapping_just_read_is_the_one_the_call_uses(fake, urls, public_dir):
    """A partner provider's call uses the mapping this server read (with its token, within status_cache_seconds),
    not a second anonymous lookup that huggingface_hub would keep for the life of the process."""
    router, _ = urls
    hosted = backend(router, public_dir, providers=("fal-ai",))
    assert hosted.infer("acme/fresh-2", draw())["provider"] == "fal-ai"
    fake.models["acme/fresh-2"]["served"][0].provider_id = "fal-ai/fresh-2-v2"  # the provider moved the model
    assert hosted.infer("acme/fresh-2", draw())["provider"] == "fal-ai"
    assert [c["provider_id"] for c in fake.calls] == ["fal-ai/fresh-2", "fal-ai/fresh-2-v2"]
    assert [c["token"] for c in fake.hub_calls if c["model"] == "acme/fresh-2"] == [TOKEN, TOKEN]  # ours alone


def test_a_hub_failure_in_huggingface_hubs_own_lookup_is_the_hubs_not_the_providers(fake, urls, public_dir):
    router, _ = urls
    hosted = backend(router, public_dir, status_ttl=60)
    observed: list[tuple[str, str]] = []
    hub_outcomes: list[str] = []
    hosted.observe_provider = lambda provider, outcome, seconds: observed.append((provider, outcome))
    hosted.observe_hub = hub_outcomes.append
    assert hosted.model_status("acme/fresh-hf-1").available  # our lookup is remembered; the library's not yet made
    fake.hub_status = 500
    with pytest.raises(HostedFailure) as info:
        hosted.infer("acme/fresh-hf-1", draw())
    assert info.value.final is False  # the Hub failing says nothing of the account: another model may run
    assert str(info.value).startswith("hosted inference of acme/fresh-hf-1 failed: the Hugging Face Hub failed (500) "
                                      "while looking up the providers of acme/fresh-hf-1"), str(info.value)
    assert [t.get("provider") for t in info.value.tried] == [None]
    assert fake.calls == [] and observed == []  # no provider was asked, none is counted
    assert hub_outcomes == ["error"]


def test_a_stale_token_in_hf_home_does_not_fail_every_hosted_task(fake, urls, public_dir, tmp_path, llm):
    """`hf auth login` left a token in HF_HOME that has since been revoked; the config names a valid one."""
    router, _ = urls
    home = tmp_path / "hf_home"
    home.mkdir()
    (home / "token").write_text(STALE)
    fake.revoked.add(STALE)
    config = write_config(tmp_path, llm.base_url, "http://127.0.0.1:9", public_dir, inference_mode="huggingface",
                          huggingface={"token": TOKEN, "router_url": router}, semantic_ranking=False,
                          choose_model="ranking")
    srv = start_server(config, tmp_path, env={"HF_ENDPOINT": router, "HF_HOME": str(home),
                                              "HF_HUB_DISABLE_TELEMETRY": "1"})
    try:
        llm.on("parse_task", json.dumps([{"task": "text-to-image", "id": 0, "dep": [-1], "args": {"text": "a lighthouse"}},
                                         {"task": "image-to-text", "id": 1, "dep": [-1],
                                          "args": {"image": "/examples/red.png"}}]))
        records = srv.post("/results", {"messages": [{"role": "user", "content": "draw a lighthouse"}]}).json()
        assert records["0"]["choose model result"]["provider"] == "fal-ai", records
        assert records["0"]["inference result"]["generated image"].startswith("/images/")
        assert records["1"]["choose model result"]["provider"] == "hf-inference", records  # the library looks it up
        assert records["1"]["inference result"]["generated text"] == "hf-inference caption of 80x60"
        assert sorted(c["provider"] for c in fake.calls) == ["fal-ai", "hf-inference"]
        assert STALE not in {c["token"] for c in fake.hub_calls} and None not in {c["token"] for c in fake.hub_calls}
    finally:
        stop_server(srv)
    assert STALE not in srv.logs() and TOKEN not in srv.logs()


def test_a_lookup_answered_but_refused_by_the_client_is_the_providers_failure_not_the_hubs(fake, urls, public_dir):
    """hf-inference's client reads the model from the Hub (which answers) and then refuses the task itself: that is
    no failure of the Hub's."""
    router, _ = urls
    fake.serve("acme/fresh-hf-9", "image-to-text", Served("hf-inference", "acme/fresh-hf-9", "text-to-image"))
    hosted = backend(router, public_dir)
    observed: list[tuple[str, str]] = []
    hub_outcomes: list[str] = []
    hosted.observe_provider = lambda provider, outcome, seconds: observed.append((provider, outcome))
    hosted.observe_hub = hub_outcomes.append
    with pytest.raises(HostedFailure) as info:
        hosted.infer("acme/fresh-hf-9", draw())
    assert "hf-inference failed: Model 'acme/fresh-hf-9' doesn't support task 'text-to-image'" in str(info.value)
    assert "Hugging Face Hub" not in str(info.value)
    assert observed == [] and hub_outcomes == []  # the router was never reached: no provider's call to count


def test_a_hub_url_a_provider_hands_back_gets_no_token(fake, urls, public_dir):
    """replicate's `txt_file` pointing at the Hub's API: fetched as a file, never with huggingface.token."""
    router, _ = urls
    fake.replicate_outputs[WHISPER] = {"txt_file": f"{router}/api/models/{FLUX}"}
    audio = resolve("/examples/hello.wav", public_dir, 10**6, 5)
    backend(router, public_dir).infer(WHISPER, TaskInputs("automatic-speech-recognition", audio=audio))
    [ours, handed_back] = [c["token"] for c in fake.hub_calls]
    assert ours == TOKEN and handed_back is None


def test_where_a_request_of_a_hosted_call_goes_compares_urls_as_sent():
    from hugginggpt.backends.hubclient import FILE, HUB, ROUTER, HostedCall

    call = HostedCall((), "https://Gw.Example.com:443/", "https://HUB.example.org/", TOKEN, UrlPolicy(), 1, 1.0)
    assert call.kind("GET", "https://hub.example.org/api/models/a/b?expand=x") == HUB
    assert call.kind("POST", "https://hub.example.org/api/models/a/b") == FILE
    assert call.kind("POST", "https://gw.example.com/fal-ai/x") == ROUTER
    assert call.kind("GET", "https://gw.example.com.evil.example/fal-ai/x") == FILE
    assert call.kind("GET", "https://gw.example.com:8443/fal-ai/x") == FILE
    assert call.kind("GET", "http://gw.example.com/fal-ai/x") == FILE
    assert call.kind("GET", "https://v3.fal.media/files/x.png") == FILE
    call.routed = True  # once the router was asked, the Hub's API is a URL like any other
    assert call.kind("GET", "https://hub.example.org/api/whoami-v2") == FILE


# -- 5. provider output files go through the URL policy ----------------------------------------------------------


def test_a_provider_file_on_an_allowed_host_is_fetched(fake, urls, public_dir):
    router, cdn = urls
    name = fake.keep(png((12, 7), (10, 20, 30)), "png")
    fake.links["fal-ai"] = f"{cdn_named(cdn)}/files/{name}"
    result = backend(router, public_dir).infer(FLUX, draw())
    image = Image.open(public_dir / result["generated image"].lstrip("/"))
    assert result["provider"] == "fal-ai" and image.size == (12, 7) and image.getpixel((0, 0)) == (10, 20, 30)


@pytest.mark.parametrize("link, says", [
    ("{cdn}/files/{secret}", "127.0.0.1 resolves to loopback address 127.0.0.1"),
    ("{named}/redirect?to={cdn}/files/{secret}", "127.0.0.1 resolves to loopback address 127.0.0.1"),
    ("http://10.1.2.3:9/files/x.png", "10.1.2.3 resolves to private address 10.1.2.3"),
    ("http://169.254.169.254/latest/meta-data/", "link-local address 169.254.169.254"),
])
def test_a_provider_file_link_to_an_internal_address_is_refused_and_the_next_provider_asked(fake, urls, public_dir,
                                                                                           link, says):
    router, cdn = urls
    secret = fake.keep(SECRET, "png")
    good = fake.keep(png((5, 5), (1, 2, 3)), "png")
    fake.links["fal-ai"] = link.format(cdn=cdn, named=cdn_named(cdn), secret=secret)
    fake.links["replicate"] = f"{cdn_named(cdn)}/files/{good}"
    result = backend(router, public_dir).infer(FLUX, draw())
    assert result["provider"] == "replicate"
    [refused] = result["fallback"]["tried"]
    assert refused["provider"] == "fal-ai" and refused["error"].startswith(
        "fal-ai returned an output file the URL policy refuses: "), refused
    assert says in refused["error"]
    assert f"/files/{secret}" not in fake.cdn_hits  # never fetched


def test_a_transcript_file_on_loopback_is_not_returned_as_the_users_result(fake, urls, public_dir):
    router, cdn = urls
    secret = fake.keep(SECRET, "txt")
    fake.replicate_outputs[WHISPER] = {"txt_file": f"{cdn}/files/{secret}"}
    audio = resolve("/examples/hello.wav", public_dir, 10**6, 5)
    with pytest.raises(HostedFailure) as info:
        backend(router, public_dir).infer(WHISPER, TaskInputs("automatic-speech-recognition", audio=audio))
    assert "replicate returned an output file the URL policy refuses" in str(info.value)
    assert "hunter2" not in str(info.value) and f"/files/{secret}" not in fake.cdn_hits
    transcript = fake.keep(b"hello from the transcript file", "txt")
    fake.replicate_outputs[WHISPER] = {"txt_file": f"{cdn_named(cdn)}/files/{transcript}"}
    result = backend(router, public_dir).infer(WHISPER, TaskInputs("automatic-speech-recognition", audio=audio))
    assert result["text"] == "hello from the transcript file"


@pytest.mark.parametrize("path", ["big", "unsaid"])
def test_a_huge_provider_file_is_cut_at_max_fetch_bytes(fake, urls, public_dir, path):
    router, cdn = urls
    fake.links["fal-ai"] = f"{cdn_named(cdn)}/{path}"
    hosted = backend(router, public_dir, providers=("fal-ai",), max_fetch_bytes=1024 * 1024)
    with pytest.raises(HostedFailure) as info:
        hosted.infer(FLUX, draw())
    assert f"fal-ai's output file of {FLUX} could not be fetched: " in str(info.value)
    assert "is larger than the 1 MiB limit" in str(info.value)


@pytest.mark.parametrize("path, status", [("expired/abc.png", 403), ("gone/abc.png", 410), ("files/none.png", 404)])
def test_an_expired_file_link_reads_as_expired_naming_the_provider(fake, urls, public_dir, path, status):
    router, cdn = urls
    fake.links["fal-ai"] = f"{cdn_named(cdn)}/{path}?X-Amz-Signature=deadbeef"
    with pytest.raises(HostedFailure) as info:
        backend(router, public_dir, providers=("fal-ai",)).infer(FLUX, draw())
    assert str(info.value) == (f"hosted inference of {FLUX} failed: the provider's file link expired or was refused "
                               f"(HTTP {status} from fal-ai's file host): the output of {FLUX} could not be fetched; "
                               "try again")
    assert "BytesIO" not in str(info.value) and "deadbeef" not in str(info.value)


def test_a_refusal_after_a_provider_error_keeps_both_in_tried(fake, urls, public_dir):
    router, _ = urls
    fake.failures["fal-ai"], fake.failures["replicate"] = 503, 402
    with pytest.raises(HostedFailure) as info:
        backend(router, public_dir).infer(FLUX, draw())
    assert info.value.final is True
    assert [(t["provider"], t["error"][:40]) for t in info.value.tried] == [
        ("fal-ai", f"fal-ai cannot serve {FLUX} right"[:40]),
        ("replicate", "the Hugging Face account has no Inferenc")]


# -- 6. replicate's wait running out --------------------------------------------------------------------------


def test_replicates_wait_running_out_is_a_timeout(fake, urls, public_dir):
    router, _ = urls
    fake.replicate_outputs[FLUX] = None
    hosted = backend(router, public_dir, providers=("replicate",))
    observed: list[tuple[str, str]] = []
    hosted.observe_provider = lambda provider, outcome, seconds: observed.append((provider, outcome))
    with pytest.raises(HostedFailure) as info:
        hosted.infer(FLUX, draw())
    assert observed == [("replicate", "timeout")]
    assert "replicate timed out: Inference request timed out after 60 seconds" in str(info.value)
    assert info.value.final is False


# -- through the server: the selection's reason, replans, events ------------------------------------------------


@pytest.fixture(scope="module")
def lite(tmp_path_factory, llm_server, servers, public_dir):
    _, router, _ = servers
    folder = tmp_path_factory.mktemp("as-met")
    config = write_config(folder, llm_server.base_url, "http://127.0.0.1:9", public_dir, inference_mode="huggingface",
                          huggingface={"token": TOKEN, "router_url": router}, semantic_ranking=False,
                          choose_model="ranking", max_replans=1)
    srv = start_server(config, folder, env={"HF_ENDPOINT": router, "HF_HUB_DISABLE_TELEMETRY": "1"})
    yield srv
    stop_server(srv)


def one_task(llm, task: str = "text-to-image", **args) -> None:
    llm.on("parse_task", json.dumps([{"task": task, "id": 0, "dep": [-1], "args": args or {"text": "a lighthouse"}}]))


def ask(text: str = "draw a lighthouse", **extra) -> dict:
    return {"messages": [{"role": "user", "content": text}], **extra}


def test_the_selection_error_says_the_hub_refused_the_token(lite, llm, fake):
    fake.revoked.add(TOKEN)
    for _ in range(2):
        one_task(llm)
        record = lite.post("/results", ask()).json()["0"]
        message = record["inference result"]["error"]["message"]
        assert message.startswith(f"no available model for text-to-image on hosted inference: {REFUSED}"), message
    assert fake.calls == []
    assert lite.logs().count("refused huggingface.token") == 1  # once per token, not per request


def test_the_selection_error_says_the_hub_failed(lite, llm, fake):
    fake.hub_status = 500
    one_task(llm)
    message = lite.post("/results", ask()).json()["0"]["inference result"]["error"]["message"]
    assert message.startswith("no available model for text-to-image on hosted inference: ")
    assert "the Hugging Face Hub failed (500) while looking up the providers of" in message
    assert "the Hugging Face Hub failed (500)" in lite.logs()
    fake.hub_status = None
    one_task(llm)
    assert lite.post("/results", ask()).json()["0"]["choose model result"]["provider"] == "fal-ai"


def test_no_replan_reaches_hosted_inference_after_the_account_was_refused(lite, llm, fake):
    fake.failures["fal-ai"] = fake.failures["replicate"] = 402
    one_task(llm)
    record = lite.post("/results", ask()).json()["0"]
    assert "no Inference Providers credits left (402 Payment Required from fal-ai)" in \
        record["inference result"]["error"]["message"]
    assert len(llm.stage_requests("parse_task")) == 1  # no replan: it could only meet the same refusal
    assert [c["provider"] for c in fake.calls] == ["fal-ai"]


def test_a_failed_tasks_event_names_where_it_failed_last(lite, llm, fake):
    fake.failures["fal-ai"], fake.failures["replicate"] = 503, 500
    one_task(llm)
    resp = requests.post(lite.url + "/hugginggpt", json=ask(stream=True), stream=True, timeout=30)
    [failed] = [e for n, e in sse(resp) if n == "task_failed"]
    assert (failed["model"], failed["hosted_on"], failed["provider"]) == (FLUX, "huggingface", "replicate"), failed


def png(size: tuple[int, int], color: tuple[int, int, int]) -> bytes:
    import io

    buf = io.BytesIO()
    Image.new("RGB", size, color).save(buf, format="PNG")
    return buf.getvalue()


def test_in_hybrid_a_hosted_refusal_still_lets_a_replan_run_on_the_local_models_server(
        tmp_path, llm_server, llm, servers, models, models_server, public_dir):
    """Hybrid: the local text-to-image model is broken and hosted inference refuses the account (402). The refusal
    stops hosted fallbacks for the rest of the request, not the replan: the new plan runs on the local server."""
    fake, router, _ = servers
    fake.reset()
    serve_models(fake)
    fake.failures["fal-ai"] = fake.failures["replicate"] = 402
    _, models_url = models_server
    models.broken.add("stabilityai/stable-diffusion-xl-base-1.0")
    config = write_config(tmp_path, llm_server.base_url, models_url, public_dir, inference_mode="hybrid",
                          huggingface={"token": TOKEN, "router_url": router}, semantic_ranking=False,
                          choose_model="ranking", max_replans=1)
    llm.on("parse_task", json.dumps([{"task": "text-to-image", "id": 0, "dep": [-1],
                                      "args": {"text": "a lighthouse"}}]), times=1)
    llm.on("parse_task", json.dumps([{"task": "token-classification", "id": 1, "dep": [-1],
                                      "args": {"text": "Anna draws lighthouses"}}]), contains="failed")
    srv = start_server(config, tmp_path, env={"HF_ENDPOINT": router, "HF_HUB_DISABLE_TELEMETRY": "1"})
    try:
        records = srv.post("/results", ask()).json()
    finally:
        stop_server(srv)
    assert len(llm.stage_requests("parse_task")) == 2  # the replan was asked for
    assert "402" in records["0"]["inference result"]["error"]["message"]
    assert records["1"]["choose model result"]["id"] == "dslim/bert-base-NER"  # and ran on the local server
    assert "error" not in records["1"]["inference result"]
