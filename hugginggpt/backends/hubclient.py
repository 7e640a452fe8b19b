"""huggingface_hub's one HTTP client, as this server needs it.

huggingface_hub makes every HTTP call (InferenceClient, HfApi, downloads) through one process-wide client from a
factory. Ours bounds each read and write by the thread's `deadline_scope` (a peer that dribbles a byte every few
seconds would otherwise restart the read timeout for ever) and goes through `proxy`. Outside a hosted call it
behaves like the library's own client.

Inside a hosted call (`hosted_call`), three kinds of request leave, and each is treated as what it is:
- **the router** (the configured `router_url`, or an own endpoint): sent as InferenceClient built it;
- **the Hub's API** (`<hub>/api/...`): InferenceClient looks up the provider mapping again with `HfApi()`, whose
  token is whatever `hf auth login` left in HF_HOME (or none): here it carries the configured token instead;
- **anything else**: a provider's output file on its CDN (fal-ai's image URL, replicate's `txt_file`), a URL the
  provider chose. It is fetched under the URL policy like every user-named URL (no loopback, private or
  link-local address, the name resolved once and pinned, each redirect checked again), under `max_fetch_bytes`
  and the call's deadline; a failure raises `ProviderFileError`.

The call records which kind its latest request was (`HostedCall.last`), so a failure is put on the right
party: the Hub's failures are never a provider's.
"""

from __future__ import annotations

import contextvars
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import httpx2

from ..errors import ResourceError
from ..urlpolicy import FetchSlow, FetchStatus, UrlPolicy, URLRefused, bound_by_deadlines, fetch

HUB, ROUTER, FILE = "hub", "router", "file"


class ProviderFileError(Exception):
    """A provider's output file could not be fetched. `status`: the file host's HTTP error status, if it sent one;
    `refused`: the URL policy refused its address; `slow`: it ran past the call's deadline."""

    def __init__(self, message: str, status: int | None = None, refused: bool = False, slow: bool = False):
        super().__init__(message)
        self.status = status
        self.refused = refused
        self.slow = slow


@dataclass
class HostedCall:
    """One hosted call's view of the network: where its router and Hub are (after the moves), the token its Hub
    lookups carry, and how a provider's file is fetched. One per call: `last` and `routed` are this call's own."""

    moves: tuple[tuple[str, str], ...]  # (library's origin, configured one): the router, the Hub
    router: str  # the configured router (or own endpoint): its requests are the provider's
    hub: str  # the configured Hub: a GET of `<hub>/api/...` before the router is asked is the Hub's API
    token: str | None
    policy: UrlPolicy
    max_bytes: int
    timeout: float
    proxy: str | None = None
    last: str = ""  # HUB | ROUTER | FILE: where this call's latest request went
    routed: bool = False  # the router has been asked: from then on only the router is trusted

    def kind(self, method: str, url: str) -> str:
        """HUB, ROUTER or FILE for a request of this call (after the moves). The Hub's API is what InferenceClient
        reads before it calls the router (a provider's model lookup); a URL a provider hands back afterwards is a
        file, wherever it points, the Hub included (it gets no token and goes through the URL policy)."""
        where = canonical(url)
        if method == "GET" and not self.routed and _under(where, canonical(self.hub) + "/api"):
            return HUB
        if _under(where, canonical(self.router)):
            return ROUTER
        return FILE


def canonical(url: str) -> str:
    """`scheme://host[:port]/path` as httpx2 sends it (lower-case scheme and host, IDN as punycode, no default port,
    no trailing slash, no query): a configured `https://Router.example:443/` and the URL a request goes to compare
    equal."""
    try:
        parsed = httpx2.URL(url)
        host = parsed.raw_host.decode("ascii")
    except Exception:  # noqa: BLE001 - not a URL httpx2 reads: compared as written
        return url.rstrip("/")
    if not parsed.scheme or not host:
        return url.rstrip("/")
    host = f"[{host}]" if ":" in host else host
    port = f":{parsed.port}" if parsed.port is not None else ""
    return f"{parsed.scheme}://{host}{port}{parsed.path.rstrip('/')}"


_CALL: contextvars.ContextVar[HostedCall | None] = contextvars.ContextVar("hosted_call", default=None)


def _hosted_call(call: HostedCall) -> Iterator[HostedCall]:
    """huggingface_hub's requests in this block follow `call` (this thread only: InferenceClient is synchronous)."""
    token = _CALL.set(call)
    try:
        yield call
    finally:
        _CALL.reset(token)


hosted_call = contextmanager(_hosted_call)  # wrapped, not decorated: mutmut skips decorated functions


def on_response(response: Any) -> None:
    """The client's response hook: inside a hosted call, what the router says of the call while it runs (fal's
    queue status, polled by huggingface_hub) becomes the task's progress."""
    call = _CALL.get()
    if call is None or call.kind(response.request.method, str(response.request.url)) != ROUTER:
        return
    from .provider_progress import on_status

    on_status(canonical(str(response.request.url))[len(canonical(call.router)):], response)


def _under(url: str, base: str) -> bool:
    return url == base or url.startswith((base + "/", base + "?"))


def on_request(request: Any) -> None:
    """The client's request hook (every hop, redirects included): a URL under a moved origin goes to its new
    one; inside a hosted call, the Hub's API gets the configured token and the call notes where it went."""
    call = _CALL.get()
    if call is None:
        return
    where = canonical(str(request.url))
    for old, new in call.moves:  # compared as sent: HF_ENDPOINT=https://HuggingFace.co:443 is huggingface.co
        base = canonical(old)
        if _under(where, base):
            query = request.url.query.decode("ascii")
            request.url = httpx2.URL(new.rstrip("/") + where[len(base):] + (f"?{query}" if query else ""))
            request.headers["Host"] = request.url.netloc.decode("ascii")
            break
    call.last = call.kind(request.method, str(request.url))
    call.routed = call.routed or call.last == ROUTER
    if call.last == HUB:
        if call.token:
            request.headers["Authorization"] = f"Bearer {call.token}"
        else:
            request.headers.pop("Authorization", None)


class ProviderFiles(httpx2.BaseTransport):
    """The client's transport: inside a hosted call, a request that goes neither to the router nor to the Hub is
    a provider's file, fetched under the URL policy; every other request goes to the inner transport."""

    def __init__(self, inner: Any):
        self.inner = inner

    def handle_request(self, request: Any) -> Any:
        call = _CALL.get()
        if call is None or call.last != FILE:  # the request hook, just before, said where this request goes
            return self.inner.handle_request(request)
        url = str(request.url)
        if request.method != "GET":
            raise ProviderFileError(f"a {request.method} to a provider's file host is not sent")
        try:
            got = fetch(url, call.policy, call.max_bytes, call.timeout, call.proxy)
        except URLRefused as exc:
            raise ProviderFileError(str(exc), refused=True) from None
        except FetchStatus as exc:
            raise ProviderFileError(str(exc), status=exc.status) from None
        except FetchSlow as exc:
            raise ProviderFileError(str(exc), slow=True) from None
        except ResourceError as exc:
            raise ProviderFileError(str(exc)) from None
        return httpx2.Response(200, headers={"Content-Type": got.content_type or "application/octet-stream"},
                               content=got.data, request=request)

    def close(self) -> None:
        self.inner.close()


_installed: list[str | None] = []
_install_lock = threading.Lock()


def install_hub_client(proxy: str | None) -> None:
    """huggingface_hub's client from now on: bounded by deadlines, through `proxy`, following `hosted_call`.
    Installed once per process (again only for another proxy)."""
    with _install_lock:
        if _installed and _installed[0] == proxy:
            return
        from huggingface_hub import set_client_factory

        hooks: dict[str, list[Any]] = {"request": [on_request], "response": [on_response]}
        try:
            from huggingface_hub.utils._http import hf_request_event_hook  # offline mode, request ids
            hooks["request"].append(hf_request_event_hook)
        except ImportError:  # pragma: no cover - a huggingface_hub without it
            pass

        def factory() -> httpx2.Client:
            client = httpx2.Client(proxy=proxy, event_hooks=hooks, follow_redirects=True, timeout=None)
            client._transport = ProviderFiles(bound_by_deadlines(client._transport))
            for pattern, transport in list(client._mounts.items()):  # env proxies are mounts
                if transport is not None:
                    client._mounts[pattern] = ProviderFiles(bound_by_deadlines(transport))
            return client

        set_client_factory(factory)
        _installed[:] = [proxy]
