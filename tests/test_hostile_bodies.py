"""Hostile bodies against both servers, over HTTP: each gets a 4xx with a one-line JSON reason (or a 2xx where the
input is legitimate), never a 5xx, and the server keeps serving."""

from __future__ import annotations

import json

import pytest
import requests

from tests.conftest import make_public

LONE = "\ud800"


def raw(text: str) -> tuple[str, bytes]:
    return ("raw", text.encode("utf-8", "surrogatepass"))


def models_server_bodies() -> list[tuple[str, object]]:
    """(model, body) pairs; a body given as ("raw", bytes) is sent as it is."""
    canny = "canny-control"
    bodies: list[tuple[str, object]] = []
    for body in ([], "text", 3, None, True, [[[]]], {"img_url": None}, {}):
        bodies.append((canny, body))
    for ref in (3, 3.5, [], ["/examples/red.png"], {"a": 1}, "", " ", LONE, "/examples/" + LONE, "../../etc/passwd",
                "/etc/passwd", "file:///etc/passwd", "ftp://example.com/a.png", "gopher://x", "javascript:alert(1)",
                "http://127.0.0.1:1/a.png", "http://[::1]/a.png", "http://169.254.169.254/latest/meta-data",
                "http://0x7f.1/a.png", "http://localhost/a.png", "data:image/png;base64,!!!!", "data:text/plain,hi",
                "data:image/png;base64,", "data:,", "data:image/png;base64," + "A" * 5, "/examples/missing.png",
                "/examples/", "/", "\x00", "/examples/red.png\x00.txt", "http://", "http://[::1/a.png",
                "http://a b/c.png", "http://example.com:99999/a.png", "x" * 5000, "/" + "a/" * 2000):
        bodies.append((canny, {"img_url": ref}))
    for field in ("low_threshold", "high_threshold"):
        for value in ("100", "", [], [1, 2], {}, {"x": 1}, True, False, None, -1, 1e9, "NaN", LONE):
            bodies.append((canny, {"img_url": "/examples/red.png", field: value}))
        for literal in ("NaN", "Infinity", "-Infinity", "1e999"):
            bodies.append((canny, raw('{"img_url": "/examples/red.png", "' + field + '": ' + literal + "}")))
    for text in (LONE, "ok" + LONE, {"t": LONE}, [LONE]):
        bodies.append((canny, {"img_url": "/examples/red.png", "text": text}))
        bodies.append(("dslim/bert-base-NER", {"text": text}))
    nested: object = "/examples/red.png"
    for _ in range(40):
        nested = [nested]
    bodies.append((canny, {"img_url": nested}))
    bodies.append((canny, {"img_url": "/examples/red.png", "deep": nested}))
    bodies.append((canny, raw("[" * 100_000 + "]" * 100_000)))
    bodies.append((canny, raw('{"img_url": "/examples/red.png"' + ', "a": {' * 5000 + "}" * 5000 + "}")))
    bodies.append((canny, raw('{"img_url": "\\ud800"}')))
    bodies.append((canny, raw('{"img_url": "/examples/red.png", "low_threshold": 1e999}')))
    bodies.append((canny, raw("not json at all")))
    bodies.append((canny, raw('{"img_url": ')))
    bodies.append((canny, ("raw", b"\xff\xfe\x00garbage")))
    for model in ("../../etc/passwd", "..", "a" * 3000, "%2e%2e/x", "x/" * 200, "no-such/model", LONE):
        bodies.append((model, {"img_url": "/examples/red.png"}))
    return bodies


def send(url: str, model: str, body: object) -> requests.Response:
    target = f"{url}/models/{model.encode('utf-8', 'surrogatepass').decode('utf-8', 'replace')}"
    if isinstance(body, tuple) and body and body[0] == "raw":
        return requests.post(target, data=body[1], headers={"Content-Type": "application/json"}, timeout=30)
    data = json.dumps(body).encode("utf-8", "surrogatepass")
    return requests.post(target, data=data, headers={"Content-Type": "application/json"}, timeout=30)


@pytest.fixture(scope="module")
def models_url(tmp_path_factory):
    from tests.test_models_server import start_models_server

    folder = tmp_path_factory.mktemp("hostile-models")
    proc, url = start_models_server(folder, folder / "no-models", make_public(folder / "public"), deployment="minimal")
    yield url
    proc.terminate()
    proc.wait(10)


def test_at_least_a_hundred_hostile_bodies_get_a_4xx_from_the_models_server(models_url):
    bodies = models_server_bodies()
    assert len(bodies) >= 100
    bad = []
    for model, body in bodies:
        resp = send(models_url, model, body)
        ok = 400 <= resp.status_code < 500 or resp.status_code == 200
        if not ok or (resp.status_code >= 400 and not resp.json().get("error", {}).get("message")):
            bad.append((model, str(body)[:80], resp.status_code, resp.text[:200]))
    assert bad == []
    assert requests.get(models_url + "/running", timeout=5).json() == {"running": True}  # still serving
    legit = send(models_url, "canny-control", {"img_url": "/examples/red.png", "low_threshold": 50})
    assert legit.status_code == 200 and "path" in legit.json()


def test_bad_thresholds_name_the_field(models_url):
    for value in ("100", [1], {"x": 1}, True, -5):
        resp = send(models_url, "canny-control", {"img_url": "/examples/red.png", "high_threshold": value})
        assert resp.status_code == 400 and "`high_threshold` must be a number" in resp.json()["error"]["message"]


def orchestrator_bodies() -> list[object]:
    msgs = [{"role": "user", "content": "hi"}]
    bodies: list[object] = [[], "text", 3, None, True, {}, {"messages": None}, {"messages": "hi"}, {"messages": []},
                            {"messages": {}}, {"messages": [None]}, {"messages": ["hi"]}, {"messages": [[]]}]
    for message in ({}, {"role": "user"}, {"content": "hi"}, {"role": "root", "content": "hi"},
                    {"role": "user", "content": 3}, {"role": "user", "content": None}, {"role": "user", "content": []},
                    {"role": "user", "content": {"text": "hi"}}, {"role": "user", "content": ""},
                    {"role": "user", "content": "   "}, {"role": "user", "content": LONE},
                    {"role": "user", "content": "x" * 100_001}, {"role": 3, "content": "hi"},
                    {"role": ["user"], "content": "hi"}, {"role": "user", "content": "hi" + LONE + "there"}):
        bodies.append({"messages": [message]})
    bodies.append({"messages": msgs * 201})
    for key in ("api_key", "api_type", "api_endpoint", "model"):
        for value in (3, [], {}, True, LONE, ["x"], {"k": "v"}):
            bodies.append({"messages": msgs, key: value})
    for api_type in ("", "openai2", "AZURE", "local ", "anthropic", "x" * 1000):
        bodies.append({"messages": msgs, "api_type": api_type})
    for flag in ("return_decisions", "stream"):
        for value in ("yes", 3, [], {}):
            bodies.append({"messages": msgs, flag: value})
    for content in ("\x00", "\x1b[31mred", "line\nforged", "\u202e", "🦊" * 1000, "<script>x</script>"):
        bodies.append({"messages": [{"role": "user", "content": content}]})  # odd but legitimate text
    for messages in ([{"role": "system", "content": "x"}] * 2, [{"role": "assistant", "content": "x"}],
                     [{"role": "user", "content": "hi", "name": {"a": 1}}], [{"role": "user", "content": "hi"}, 3],
                     [{"role": "user", "content": "hi"}, {"role": "user"}], [{"role": "tool", "content": "hi"}],
                     [{"role": "user", "content": "hi", "content ": 3}], [{"ROLE": "user", "content": "hi"}]):
        bodies.append({"messages": messages})
    for extra in ({"extra": LONE}, {"messages2": []}, {"stream": None}, {"api_key": ""}, {"api_endpoint": ""},
                  {"model": ""}, {"api_type": None}, {"return_decisions": None}, {"__proto__": {"x": 1}},
                  {"constructor": "x"}, {"api_key": "k" * 10_000}):
        bodies.append({"messages": msgs, **extra})
    nested: object = "hi"
    for _ in range(60):
        nested = [nested]
    bodies.append({"messages": [{"role": "user", "content": nested}]})
    bodies.append(raw("[" * 100_000 + "]" * 100_000))
    bodies.append(raw('{"messages": [{"role": "user", "content": "\\ud800"}]}'))
    bodies.append(raw('{"messages": ' + "[" * 5000 + "]" * 5000 + "}"))
    bodies.append(raw("not json"))
    bodies.append(raw('{"messages": ['))
    bodies.append(("raw", b"\xff\xfe\x00"))
    return bodies


def test_at_least_a_hundred_hostile_bodies_get_a_4xx_from_the_orchestrator(server, llm):
    llm.on("parse_task", "[]")
    bodies = orchestrator_bodies()
    assert len(bodies) >= 100
    bad = []
    for route in ("/hugginggpt", "/tasks", "/results"):
        for body in bodies:
            if isinstance(body, tuple):
                resp = requests.post(server.url + route, data=body[1], headers={"Content-Type": "application/json"},
                                     timeout=30)
            else:
                resp = requests.post(server.url + route, data=json.dumps(body).encode("utf-8", "surrogatepass"),
                                     headers={"Content-Type": "application/json"}, timeout=30)
            if not (400 <= resp.status_code < 500 or resp.status_code == 200):
                bad.append((route, str(body)[:80], resp.status_code, resp.text[:200]))
            elif resp.status_code >= 400 and not resp.json().get("error", {}).get("message"):
                bad.append((route, str(body)[:80], resp.status_code, "no error message"))
    assert bad == []
    assert requests.get(server.url + "/health", timeout=5).status_code == 200


def test_the_models_list_names_no_server_path(models_url):
    """A client learns why a model cannot be served, not where the server keeps its files."""
    listing = requests.get(models_url + "/models", timeout=10).json()
    problems = [m["problem"] for m in listing["models"] if m["problem"]]
    assert problems and any("local_models_dir/" in p for p in problems)
    assert not any("no-models" in p or "/tmp/" in p for p in problems)  # the absolute models folder


def test_a_body_over_the_models_servers_limit_is_a_413(models_url):
    """The models server takes bodies up to 50 MiB (data URIs of large inputs); past that, a 413, not a parse."""
    data = b'{"img_url": "data:image/png;base64,' + b"A" * (50 * 1024 * 1024) + b'"}'
    resp = requests.post(models_url + "/models/canny-control", data=data,
                         headers={"Content-Type": "application/json"}, timeout=120)
    assert resp.status_code == 413 and resp.json()["error"]["message"]
