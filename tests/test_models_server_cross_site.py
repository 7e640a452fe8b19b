"""Models server without a token against web pages (issue 20, item 7): JSON only, an Origin check, a Host
allowlist (DNS rebinding) and a loopback listen address unless a token is set. Over HTTP, real server."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import requests

import models_server
from tests.test_models_server import start_models_server

MODEL = "/models/no-such/model"  # 404 once a request is let in; the checks answer before the route runs


@pytest.fixture(scope="module")
def open_server(tmp_path_factory, public_dir):
    folder = tmp_path_factory.mktemp("cross-site")
    proc, url = start_models_server(folder, folder / "models", public_dir, deployment="minimal",
                                    extra=("models_server_hosts: [gpu-box.internal]",))
    yield url
    proc.terminate()
    proc.wait(10)


def port_of(url: str) -> str:
    return url.rsplit(":", 1)[1]


def test_a_simple_cross_site_post_is_refused(open_server):
    evil = {"Origin": "https://evil.example"}
    # what a foreign page can send without a preflight: text/plain, form bodies
    plain = requests.post(open_server + MODEL, data='{"text": "hi"}', headers={"Content-Type": "text/plain"},
                          timeout=5)
    assert plain.status_code == 415 and "application/json" in plain.json()["error"]["message"]
    form = requests.post(open_server + MODEL, data={"text": "hi"}, timeout=5)
    assert form.status_code == 415
    assert requests.post(open_server + MODEL, data="{}", headers={**evil, "Content-Type": "text/plain"},
                         timeout=5).status_code == 403
    assert requests.post(open_server + MODEL, json={"text": "hi"}, headers=evil, timeout=5).status_code == 403
    for origin in ("null", "chrome-extension://localhost", "file://localhost", "ws://127.0.0.1"):  # http(s) only
        assert requests.post(open_server + MODEL, json={"text": "hi"}, headers={"Origin": origin},
                             timeout=5).status_code == 403, origin
    assert requests.get(open_server + "/models", headers=evil, timeout=5).status_code == 403


def test_json_from_loopback_pages_and_the_orchestrator_is_served(open_server):
    for headers in ({}, {"Origin": "http://localhost:8004"}, {"Origin": "http://127.0.0.1:3000"},
                    {"Origin": open_server}):
        resp = requests.post(open_server + MODEL, json={"text": "hi"}, headers=headers, timeout=5)
        assert resp.status_code == 404 and "unknown model" in resp.json()["error"]["message"], headers
    assert requests.get(open_server + "/running", timeout=5).json() == {"running": True}


def test_host_names_outside_the_allowlist_are_refused(open_server):
    port = port_of(open_server)
    for host in (f"evil.example:{port}", "rebind.attacker.test", f"localhost.evil.example:{port}", ""):
        resp = requests.get(open_server + "/running", headers={"Host": host}, timeout=5)
        assert resp.status_code == 403 and "models_server_hosts" in resp.json()["error"]["message"], host
        resp = requests.post(open_server + MODEL, json={"text": "hi"}, headers={"Host": host}, timeout=5)
        assert resp.status_code == 403, host
    for host in (f"127.0.0.1:{port}", f"localhost:{port}", "LOCALHOST.", f"[::1]:{port}",
                 f"gpu-box.internal:{port}", f"10.1.2.3:{port}"):
        assert requests.get(open_server + "/running", headers={"Host": host}, timeout=5).ok, host


def test_a_token_replaces_the_browser_checks(tmp_path, public_dir):
    proc, url = start_models_server(tmp_path, tmp_path / "models", public_dir, deployment="minimal", token="s3cret")
    try:
        auth = {"Authorization": "Bearer s3cret"}
        assert requests.get(url + "/running", headers={**auth, "Host": "gpu-box.example"}, timeout=5).ok
        assert requests.get(url + "/running", headers={"Host": "evil.example"}, timeout=5).status_code == 401
        assert requests.post(url + MODEL, json={"text": "hi"}, headers={"Origin": "https://evil.example"},
                             timeout=5).status_code == 401
    finally:
        proc.terminate()
        proc.wait(10)


def config(host: str, token: str | None = None) -> SimpleNamespace:
    return SimpleNamespace(models_host=host, models_server_token=token)


def test_without_a_token_it_listens_on_loopback_and_says_how_to_open_it(capsys):
    assert models_server.listen_host(config("0.0.0.0"), None) == "127.0.0.1"
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "models_server_token" in err and "--host 0.0.0.0" in err
    assert models_server.listen_host(config("0.0.0.0", token="t"), None) == "0.0.0.0"
    assert models_server.listen_host(config("localhost"), None) == "localhost"
    assert models_server.listen_host(config("127.0.0.1"), "0.0.0.0") == "0.0.0.0"  # asked for on the command line
    assert "without models_server_token" in capsys.readouterr().err


def test_the_shipped_configs_listen_on_loopback():
    from pathlib import Path

    from hugginggpt.config import load_config

    for path in sorted(Path(__file__).resolve().parent.parent.glob("configs/*.yaml")):
        cfg = load_config(path, need_llm=False)
        assert cfg.models_server_token or models_server.listen_host(cfg, None) in models_server.LOOPBACK, path
