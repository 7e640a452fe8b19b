"""Quick, non-fatal checks a person starting the server wants to see: is the port free, does the LLM answer,
is the models server up. Each answers in about a second (or at once when nothing listens) with None for
"fine" or one line saying what is wrong.

The LLM and models server checks read only configured, trusted endpoints (never one named by a request).
"""

from __future__ import annotations

import errno
import os
import socket
import sys
import threading
import time
from collections.abc import Callable

import requests

from .config import LLMSettings
from .urlpolicy import redact_url

OPENAI_BASE = "https://api.openai.com/v1"


def port_problem(host: str, port: int) -> str | None:
    """Why `host:port` cannot be listened on now ("is already in use", ...), or None when it can."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as waitress does: TIME_WAIT is no problem
        try:
            sock.bind((host, port))
            sock.listen(1)
        except OSError as exc:
            return {errno.EADDRINUSE: "is already in use", errno.EACCES: "needs more privileges",
                    errno.EADDRNOTAVAIL: "is not an address of this machine"}.get(exc.errno,
                                                                                  f"cannot be used ({exc.strerror})")
        except OverflowError:
            return "is not a port number (1-65535)"
    return None


def taken_port_line(host: str, port: int, script: str) -> str | None:
    """The one line a launcher (tools/demo.py, tools/start.py) prints when its port cannot be used, naming how to
    pick another in the words of the command the person typed (`make run` sets HUGGINGGPT_VIA); None when free."""
    problem = port_problem(host, port)
    if problem is None:
        return None
    via = os.environ.get("HUGGINGGPT_VIA")
    other = 9000 if port != 9000 else 9001
    hint = f"`{via} PORT={other}`" if via else f"`python {script} --port {other}`"
    return (f"error: port {port} {problem} (a demo or server already running there? open http://127.0.0.1:{port}/ "
            f"or stop it); choose another with {hint}")


def _why(exc: requests.RequestException) -> str:
    if isinstance(exc, requests.ConnectTimeout | requests.ReadTimeout):
        return "no answer in time"
    if isinstance(exc, requests.ConnectionError):
        text = str(exc)
        if "refused" in text.lower():
            return "connection refused: nothing listens there"
        if "resolve" in text.lower() or "Name or service" in text:
            return "the host name does not resolve"
        return "connection failed"
    return exc.__class__.__name__


def llm_problem(settings: LLMSettings, proxy: str | None = None, timeout: float = 3.0) -> str | None:
    """One GET of the backend's model list: any HTTP answer means it is reachable (a 401 says the key is
    refused). None when it answers; otherwise the problem, naming the endpoint (redacted)."""
    if settings.api_type is None:
        return None  # each request brings its own backend
    from .llm import normalize_endpoint

    if settings.api_type == "azure":
        url = (settings.endpoint or "").rstrip("/") + "/openai/models?api-version=" + settings.azure_api_version
        headers = {"api-key": settings.api_key or ""}
    else:
        base = normalize_endpoint(settings.endpoint) if settings.endpoint else OPENAI_BASE
        url = base.rstrip("/") + "/models"
        headers = {"Authorization": f"Bearer {settings.api_key}"} if settings.api_key else {}
    where = redact_url(url.rsplit("/models", 1)[0])
    try:
        resp = requests.get(url, headers=headers, timeout=timeout, allow_redirects=False,
                            proxies={"http": proxy, "https": proxy} if proxy else None)
    except requests.RequestException as exc:
        return f"the LLM at {where} is unreachable ({_why(exc)})"
    if resp.status_code in (401, 403):
        return f"the LLM at {where} refuses the configured key (HTTP {resp.status_code})"
    return None


def models_server_problem(base_url: str, token: str | None = None, timeout: float = 2.0) -> str | None:
    """GET /running on the models server; None when it says it runs."""
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    try:
        resp = requests.get(base_url.rstrip("/") + "/running", headers=headers, timeout=timeout)
    except requests.RequestException as exc:
        return f"the models server at {base_url} is down ({_why(exc)})"
    try:
        if resp.status_code == 200 and resp.json().get("running"):
            return None
    except (ValueError, AttributeError):
        pass
    return f"the models server at {base_url} answered HTTP {resp.status_code}, not {{\"running\": true}}"


class CachedCheck:
    """A check run at most once per `ttl` seconds (/health may be polled often); one caller runs it at a time."""

    def __init__(self, check: Callable[[], str | None], ttl: float = 10.0):
        self.check, self.ttl = check, ttl
        self._lock = threading.Lock()
        self._at = -1e9
        self._value: str | None = None

    def __call__(self) -> str | None:
        with self._lock:
            if time.monotonic() - self._at >= self.ttl:
                self._value = self.check()
                self._at = time.monotonic()
            return self._value


def print_start_checks(engine) -> None:
    """One line each for the LLM and the models server at start: what answers, what does not (not fatal)."""
    where = {"llm": f"the LLM ({engine.config.llm.summary()})",
             "models_server": f"the models server at {engine.config.models_server_url}"}
    for name, problem in engine.checks(fresh=True).items():
        if problem is None:
            print(f"check: {where[name]} answers", file=sys.stderr, flush=True)
        elif problem != "unused":
            print(f"warning: {problem}; requests that need it fail until it is up", file=sys.stderr, flush=True)
