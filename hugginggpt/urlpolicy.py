"""Outbound URL policy for URLs that a request names (plan arguments, `img_url`, result URLs).

A user-named URL may only reach public addresses: loopback, private, link-local, CGNAT, multicast,
reserved and unspecified addresses are refused, including their IPv6 forms that embed an IPv4 address
(`::ffff:169.254.169.254`, 6to4, NAT64). The host is resolved once and the connection goes to the very
address that was checked (no second lookup for DNS rebinding to exploit); every redirect hop is checked
again. `url_allowlist` (host names or CIDRs) opens exceptions. Endpoints named by the config (LLM,
models server, hosted inference) never pass through here: they are trusted. An LLM endpoint a request names
is checked here too, and its client connects only to the checked address (`PinnedBackend`).
"""

from __future__ import annotations

import contextlib
import heapq
import ipaddress
import itertools
import math
import re
import socket
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urljoin, urlsplit

import httpcore2
import urllib3
import urllib3.connection

from . import cancel
from .errors import ResourceError

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
Network = ipaddress.IPv4Network | ipaddress.IPv6Network
Resolver = Callable[[str, int], list[str]]

MAX_REDIRECTS = 5
_CGNAT = ipaddress.ip_network("100.64.0.0/10")
_NAT64 = (ipaddress.ip_network("64:ff9b::/96"), ipaddress.ip_network("64:ff9b:1::/48"))
_IPV4_COMPATIBLE = ipaddress.ip_network("::/96")


_SECRET_PARAM = re.compile(r"key|token|secret|sig|signature|password|passwd|pwd|auth|credential|session|code",
                           re.IGNORECASE)
_URL_IN_TEXT = re.compile(r"\b[a-zA-Z][a-zA-Z0-9+.-]*://[^\s'\"<>]+")


def redact_url(url: str) -> str:
    """A URL fit to show anywhere (errors, events, logs): userinfo and token-like query values are `***`."""
    text = str(url)
    scheme, sep, rest = text.partition("://")
    if not sep:
        return text
    end = len(rest)
    for mark in "/?#":
        at = rest.find(mark)
        if at != -1:
            end = min(end, at)
    authority, tail = rest[:end], rest[end:]
    if "@" in authority:
        authority = "***@" + authority.rsplit("@", 1)[1]
    if "?" in tail:
        path, _, query = tail.partition("?")
        query, hash_sep, fragment = query.partition("#")
        pairs = []
        for pair in query.split("&"):
            name, eq, value = pair.partition("=")
            pairs.append(f"{name}=***" if eq and _SECRET_PARAM.search(name) else pair)
        tail = f"{path}?{'&'.join(pairs)}{hash_sep}{fragment}"
    return f"{scheme}://{authority}{tail}"


def redact_urls_in(text: str) -> str:
    """Every URL inside a message, redacted (see `redact_url`)."""
    return _URL_IN_TEXT.sub(lambda m: redact_url(m.group(0)), str(text))


class URLRefused(ResourceError):
    """The URL's target is not allowed by the outbound URL policy."""


class FetchSlow(ResourceError):
    """A fetch ran past its timeout or the request's deadline, however the peer paced its bytes."""


class FetchStatus(ResourceError):
    """The server answered a fetch with an HTTP error status (`status`): an expired signed link reads 403."""

    def __init__(self, message: str, status: int):
        super().__init__(message)
        self.status = status


def system_resolver(host: str, port: int) -> list[str]:
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError):
        raise ResourceError(f"cannot resolve host {host!r}") from None
    return list(dict.fromkeys(info[4][0].split("%")[0] for info in infos))


def embedded_ipv4(addr: IPAddress) -> ipaddress.IPv4Address | None:
    """The IPv4 address an IPv6 address stands for (mapped, compatible, 6to4, NAT64, Teredo), if any."""
    if not isinstance(addr, ipaddress.IPv6Address):
        return None
    if addr.ipv4_mapped is not None:
        return addr.ipv4_mapped
    if addr.sixtofour is not None:
        return addr.sixtofour
    if addr.teredo is not None:
        return addr.teredo[1]
    if any(addr in net for net in _NAT64) or (addr in _IPV4_COMPATIBLE and int(addr) > 1):
        return ipaddress.IPv4Address(int(addr) & 0xFFFFFFFF)
    return None


def blocked_reason(addr: IPAddress) -> str | None:
    """Why a user-named URL may not reach `addr`, or None for a public address."""
    inner = embedded_ipv4(addr)
    if inner is not None:  # the IPv6 form is only a way of writing the IPv4 address: judge that one
        reason = blocked_reason(inner)
        return f"{reason} (IPv4 {inner} inside {addr})" if reason else None
    checks = (
        ("loopback", addr.is_loopback),
        ("unspecified", addr.is_unspecified),
        ("link-local", addr.is_link_local),
        ("multicast", addr.is_multicast),
        ("carrier-grade NAT", isinstance(addr, ipaddress.IPv4Address) and addr in _CGNAT),
        ("private", addr.is_private),
        ("site-local", isinstance(addr, ipaddress.IPv6Address) and addr.is_site_local),
        ("reserved", addr.is_reserved),
        ("non-global", not addr.is_global),  # pragma: no mutate: unreachable on 3.11 (every non-global address is caught above)
    )
    for name, hit in checks:
        if hit:
            return f"{name} address {addr}"
    return None


@dataclass(frozen=True)
class Target:
    """One checked hop: where to connect (`address`) and what to say in Host/SNI (`host`)."""

    url: str
    scheme: str
    host: str
    port: int
    address: str
    request_target: str  # path and query

    @property
    def host_header(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        default = 443 if self.scheme == "https" else 80
        return host if self.port == default else f"{host}:{self.port}"


@dataclass(frozen=True)
class UrlPolicy:
    allow_hosts: frozenset[str] = frozenset()
    allow_networks: tuple[Network, ...] = ()
    resolver: Resolver = field(default=system_resolver, compare=False)

    @classmethod
    def from_entries(cls, entries: Iterable[str] = (), resolver: Resolver | None = None) -> UrlPolicy:
        """`url_allowlist` entries: host names (exact match) or IP addresses / CIDRs."""
        hosts: set[str] = set()
        networks: list[Network] = []
        for entry in entries:
            entry = str(entry).strip()
            if not entry:
                continue
            try:
                networks.append(ipaddress.ip_interface(entry.strip("[]")).network)  # host bits dropped: a /24 of .7 is .0/24
            except ValueError:
                hosts.add(_canonical_host(entry))
        return cls(frozenset(hosts), tuple(networks), resolver or system_resolver)

    def _allowed_by_network(self, addr: IPAddress) -> bool:
        inner = embedded_ipv4(addr)
        return any(addr in net or (inner is not None and inner in net) for net in self.allow_networks)

    def check(self, url: str) -> Target:
        """Resolve once and check every address; raises URLRefused with the reason."""
        try:
            parts = urlsplit(url)
        except ValueError:  # e.g. "http://[::1/x": an unclosed or empty IPv6 bracket
            raise URLRefused(f"refusing {redact_url(url)!r}: not a valid URL") from None
        scheme = parts.scheme.lower()
        if scheme not in ("http", "https"):
            raise URLRefused(f"refusing {redact_url(url)!r}: only http(s) URLs can be fetched")
        if parts.username is not None or parts.password is not None:
            raise URLRefused(f"refusing {redact_url(url)!r}: credentials in URLs are not accepted")
        try:
            port = parts.port or (443 if scheme == "https" else 80)
        except ValueError:
            raise URLRefused(f"refusing {redact_url(url)!r}: invalid port") from None
        host = _canonical_host(parts.hostname or "")
        if not host:
            raise URLRefused(f"refusing {redact_url(url)!r}: no host")
        addresses = self.resolver(host, port)
        if not addresses:
            raise ResourceError(f"cannot resolve host {host!r}")
        if host not in self.allow_hosts:
            for raw in addresses:
                addr = ipaddress.ip_address(raw)
                if self._allowed_by_network(addr):
                    continue
                reason = blocked_reason(addr)
                if reason:
                    raise URLRefused(f"refusing to fetch {redact_url(url)!r}: {host} resolves to {reason}; "
                                     "add it to url_allowlist in the config if this is intended")
        target = parts.path or "/"
        if parts.query:
            target += "?" + parts.query
        return Target(url=url, scheme=scheme, host=host, port=port, address=addresses[0], request_target=target)


def _canonical_host(host: str) -> str:
    return host.strip().strip("[]").rstrip(".").lower()


@dataclass(frozen=True)
class Fetched:
    data: bytes
    content_type: str
    url: str  # after redirects


def fetch(url: str, policy: UrlPolicy, max_bytes: int, timeout: float, proxy: str | None = None,
          headers: dict[str, str] | None = None) -> Fetched:
    """GET a user-named URL under the policy, with a size limit and one deadline for the whole fetch."""
    own = time.monotonic() + timeout
    with deadline_scope(own) as watch:
        assert watch is not None  # a scope given a deadline always has a watch
        deadline = watch.deadline  # the request's, where it comes first
        if deadline < own:
            slow = f"the request's deadline passed while fetching {redact_url(url)!r}"
        else:
            slow = f"fetching {redact_url(url)!r} took longer than {timeout:.0f}s"
        try:
            got = _fetch(url, policy, max_bytes, proxy, headers, deadline)
        except _Late:
            raise FetchSlow(slow) from None
        except ResourceError:
            if watch.passed():  # whichever timer woke first: a failure from then on is slowness
                raise FetchSlow(slow) from None
            raise
        if watch.fired:  # a body with no length said, cut by the watchdog, ends as if whole
            raise FetchSlow(slow)
    return got


class _Late(Exception):
    """The fetch's own clock saw its deadline pass; `fetch` names it (one message, whoever noticed)."""


def _fetch(url: str, policy: UrlPolicy, max_bytes: int, proxy: str | None,
           headers: dict[str, str] | None, deadline: float) -> Fetched:
    for _ in range(MAX_REDIRECTS + 1):
        target = policy.check(url)
        left = deadline - time.monotonic()
        if left <= 0:
            raise _Late
        pool, resp = _open(target, left, proxy, headers or {})
        try:
            location = resp.headers.get("Location")  # pragma: no mutate: header names are case-insensitive
            if resp.status in (301, 302, 303, 307, 308) and location:
                try:
                    url = urljoin(url, location)
                except ValueError:  # e.g. "http://[::1/x": an unclosed IPv6 bracket
                    raise ResourceError(f"fetching {redact_url(target.url)!r} failed: it redirects to an invalid "
                                        "URL") from None
                continue
            if resp.status >= 400:
                raise FetchStatus(f"fetching {redact_url(target.url)!r} failed: HTTP {resp.status}", resp.status)
            content_type = resp.headers.get("Content-Type")  # pragma: no mutate: header names are case-insensitive
            return Fetched(_read_limited(resp, target.url, max_bytes, deadline),
                           (content_type or "").split(";")[0].strip(), target.url)
        finally:
            resp.release_conn()
            if isinstance(pool, urllib3.PoolManager):  # the proxy's manager: it has no close()
                pool.clear()
            else:
                pool.close()
    raise ResourceError(f"fetching {redact_url(url)!r}: more than {MAX_REDIRECTS} redirects")


def _open(target: Target, timeout: float, proxy: str | None,
          headers: dict[str, str]) -> tuple[urllib3.PoolManager | urllib3.HTTPConnectionPool, urllib3.BaseHTTPResponse]:
    limits = urllib3.Timeout(connect=min(timeout, 10.0), read=timeout)
    send = {"User-Agent": "hugginggpt-server", **headers, "Host": target.host_header}
    try:
        if proxy:  # the proxy connects; we checked the name it will resolve (pinning is the proxy's job)
            manager = urllib3.ProxyManager(proxy, timeout=limits, retries=False)
            manager.pool_classes_by_scheme = WATCHED_POOL_CLASSES  # its sockets end at the deadline too
            return manager, manager.urlopen("GET", target.url, headers=send,
                                            redirect=False, preload_content=False,  # pragma: no mutate: None is false too
                                            )
        if target.scheme == "https":
            # a valid certificate for the name, not the address we connect to (said here though urllib3's default)
            pool: urllib3.HTTPConnectionPool = WatchedHTTPSConnectionPool(
                target.address, target.port, timeout=limits, retries=False,
                server_hostname=target.host,  # pragma: no mutate: no TLS peer in tests
                assert_hostname=target.host, cert_reqs="CERT_REQUIRED",  # pragma: no mutate: no TLS peer in tests
            )
        else:
            pool = WatchedHTTPConnectionPool(target.address, target.port, timeout=limits, retries=False)
        return pool, pool.urlopen("GET", target.request_target, headers=send,  # a path: always the pool's host
                                  redirect=False, preload_content=False,  # pragma: no mutate: None is false too
                                  )
    except urllib3.exceptions.HTTPError as exc:
        raise ResourceError(f"fetching {redact_url(target.url)!r} failed: {exc.__class__.__name__}") from None


def _read_limited(resp: urllib3.BaseHTTPResponse, url: str, max_bytes: int, deadline: float) -> bytes:
    limit_text = f"{redact_url(url)!r} is larger than the {max_bytes // (1024 * 1024)} MiB limit"
    declared = resp.headers.get("Content-Length")  # pragma: no mutate: header names are case-insensitive
    if declared and declared.isdigit() and int(declared) > max_bytes:
        raise ResourceError(limit_text)
    chunks, size = [], 0
    try:
        for chunk in resp.stream():  # urllib3's chunks: 64 KiB
            size += len(chunk)
            if size > max_bytes:
                raise ResourceError(limit_text)
            if time.monotonic() > deadline:  # pragma: no mutate: > and >= differ only at one instant
                raise _Late
            chunks.append(chunk)
    except urllib3.exceptions.HTTPError as exc:
        raise ResourceError(f"fetching {redact_url(url)!r} failed: {exc.__class__.__name__}") from None
    return b"".join(chunks)


# -- total deadlines ------------------------------------------------------------------------------------
#
# A socket read timeout restarts on every byte, so a peer that sends one byte (or one SSE comment) every few
# seconds outlives any per-read timeout. Every outbound call made inside `deadline_scope(d)` must be over by
# `d` (time.monotonic()), however the peer paces its bytes:
# - httpx2/httpcore2 (the openai SDK, huggingface_hub): the network backend is pluggable, so each read and
#   write gets as its timeout the time left until the deadline (`DeadlineBackend`); exact, no extra thread.
# - urllib3/requests (models server, URL fetches): http.client reads under one socket timeout that cannot be
#   changed per read, so the connection registers its socket with the scope and one shared watchdog thread
#   shuts it down (which wakes a blocked recv at once) when the deadline passes.

_scope = threading.local()


class _Watch:
    """The sockets one deadline scope used; shut down when the deadline passes first, or when the request is
    cancelled. httpx2 streams (`using`) are shut down only on a cancel: at the deadline their clamped
    timeouts end them exactly, with a timeout error that says so."""

    def __init__(self, deadline: float):
        self.deadline = deadline
        self.fired = self.cancelled = self.done = False  # pragma: no mutate: None would be as false
        self._sockets: list[socket.socket] = []
        self._in_use: list[socket.socket] = []
        self._lock = threading.Lock()

    def passed(self) -> bool:
        """Whether the deadline has come, whichever timer saw it first: the watchdog, or a socket's own timeout
        (set to the time left, it ends at the deadline too, and on a busy machine may wake before the watchdog).
        A failure from then on is slowness, not a broken peer."""
        return time.monotonic() >= self.deadline  # pragma: no mutate: >= and > differ only at one instant

    def register(self, sock: socket.socket | None) -> None:
        if sock is None:
            return
        with self._lock:
            if not self.fired:
                if sock not in self._sockets:
                    self._sockets.append(sock)
                return
        _shutdown(sock)

    def _using(self, sock: socket.socket | None) -> Iterator[None]:
        """`sock` is shut down if the request is cancelled while the block runs (only then: a pooled connection
        may serve another request next)."""
        if sock is not None:
            with self._lock:
                cancelled = self.cancelled
                if not cancelled:
                    self._in_use.append(sock)
            if cancelled:
                _shutdown(sock)
        try:
            yield
        finally:
            if sock is not None:
                with self._lock:
                    if sock in self._in_use:
                        self._in_use.remove(sock)

    using = contextmanager(_using)  # wrapped, not decorated: mutmut skips decorated functions

    def unregister(self, sock: socket.socket | None) -> None:
        """`sock` went back to its pool: another request may use it next."""
        with self._lock:
            if sock in self._sockets:
                self._sockets.remove(sock)

    def fire(self) -> None:
        """The deadline passed. Sockets are shut down under the lock, so none is shut after its owner let it go
        back to a pool (`using`, `unregister`); a shutdown never blocks."""
        with self._lock:
            if self.done:
                return
            self.fired = True
            for sock in self._sockets:
                _shutdown(sock)
            self._sockets = []

    def cancel(self) -> None:
        """The request was cancelled: every socket of the scope is shut down, those of httpx2 streams too."""
        with self._lock:
            if self.done:
                return
            self.cancelled = True
            for sock in self._in_use:
                _shutdown(sock)
            self._in_use = []
        self.fire()

    def finish(self) -> None:
        with self._lock:
            self.done = True
            self._sockets = []
            self._in_use = []


def _shutdown(sock: socket.socket) -> None:
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass


class _Watchdog:
    """One daemon thread for every scope of the process: a heap of deadlines, woken when an earlier one comes."""

    def __init__(self) -> None:
        self._heap: list[tuple[float, int, _Watch]] = []
        self._cond = threading.Condition()
        self._thread: threading.Thread | None = None
        self._order = itertools.count()  # a tie-breaker between equal deadlines (a _Watch has no order)

    def add(self, watch: _Watch) -> None:
        with self._cond:
            heapq.heappush(self._heap, (watch.deadline, next(self._order), watch))
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="deadline-watchdog", daemon=True)
                self._thread.start()
            self._cond.notify()

    def _run(self) -> None:
        while True:
            with self._cond:
                while self._heap and self._heap[0][2].done:
                    heapq.heappop(self._heap)
                if not self._heap:
                    self._cond.wait()
                    continue
                wait = self._heap[0][0] - time.monotonic()
                if wait > 0:  # pragma: no mutate: at 0 the wait returns at once and the next pass fires the watch
                    self._cond.wait(wait)
                    continue
                _, _, watch = heapq.heappop(self._heap)
            watch.fire()


_WATCHDOG = _Watchdog()


def _deadline_scope(deadline: float | None) -> Iterator[_Watch | None]:
    """Outbound I/O of this thread inside the block ends by `deadline` (the earlier one when scopes nest), or
    when this thread's request is cancelled (`cancel.CURRENT`): its sockets are shut down then."""
    outer = getattr(_scope, "watch", None)
    token = cancel.current()
    if deadline is None:
        if outer is not None or token is None:
            yield outer
            return
        deadline = math.inf  # no deadline, but a request that may be cancelled: a watch for its sockets
    elif outer is not None and outer.deadline <= deadline:
        yield outer
        return
    watch = _Watch(deadline)
    if deadline != math.inf:
        _WATCHDOG.add(watch)
    _scope.watch = watch
    try:
        with token.hooked(watch.cancel) if token is not None else nullcontext():
            yield watch
    finally:
        watch.finish()
        _scope.watch = outer


deadline_scope = contextmanager(_deadline_scope)  # wrapped, not decorated: mutmut skips decorated functions


def current_deadline() -> float | None:
    watch = getattr(_scope, "watch", None)
    return watch.deadline if watch is not None and watch.deadline != math.inf else None


def _register_socket(sock: socket.socket | None) -> None:
    watch = getattr(_scope, "watch", None)
    if watch is not None:
        watch.register(sock)


class _WatchedMixin:
    """urllib3 connection whose socket is shut down when the thread's deadline scope runs out."""

    def getresponse(self) -> Any:
        _register_socket(self.sock)  # type: ignore[attr-defined]
        return super().getresponse()  # type: ignore[misc]


class WatchedHTTPConnection(_WatchedMixin, urllib3.connection.HTTPConnection):
    pass


class WatchedHTTPSConnection(_WatchedMixin, urllib3.connection.HTTPSConnection):
    pass


class _UnwatchedOnReturn:
    """A connection back in its pool leaves the thread's scope: the next request to take it is not the one
    whose deadline or cancel the scope is for."""

    def _put_conn(self, conn: Any) -> None:
        watch = getattr(_scope, "watch", None)
        if watch is not None and conn is not None:
            watch.unregister(conn.sock)
        super()._put_conn(conn)  # type: ignore[misc]


class WatchedHTTPConnectionPool(_UnwatchedOnReturn, urllib3.HTTPConnectionPool):
    ConnectionCls = WatchedHTTPConnection


class WatchedHTTPSConnectionPool(_UnwatchedOnReturn, urllib3.HTTPSConnectionPool):
    ConnectionCls = WatchedHTTPSConnection


WATCHED_POOL_CLASSES = {"http": WatchedHTTPConnectionPool, "https": WatchedHTTPSConnectionPool}


def watched_adapter(**kwargs: Any) -> Any:
    """A requests HTTPAdapter whose connections obey `deadline_scope`."""
    import requests.adapters

    class _Adapter(requests.adapters.HTTPAdapter):
        def init_poolmanager(self, *args: Any, **kw: Any) -> None:
            super().init_poolmanager(*args, **kw)
            self.poolmanager.pool_classes_by_scheme = WATCHED_POOL_CLASSES

    return _Adapter(**kwargs)


class _DeadlineStream(httpcore2.NetworkStream):
    """Each read/write waits at most until the thread's deadline; past it, a timeout at once."""

    def __init__(self, inner: httpcore2.NetworkStream):
        self._inner = inner

    @staticmethod
    def _clamp(timeout: float | None, exc: type[Exception]) -> float | None:
        if cancel.cancelled():
            raise exc("the request was cancelled")
        deadline = current_deadline()
        if deadline is None:
            return timeout
        left = deadline - time.monotonic()
        if left <= 0:
            raise exc("the request's deadline passed")
        return left if timeout is None else min(timeout, left)

    def _watched(self) -> contextlib.AbstractContextManager[None]:
        """While it reads or writes, the socket is in the thread's scope, so a cancel (or the watchdog) can
        wake a blocked call at once."""
        watch = getattr(_scope, "watch", None)
        return watch.using(self._inner.get_extra_info("socket")) if watch is not None else nullcontext()

    def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        timeout = self._clamp(timeout, httpcore2.ReadTimeout)
        with self._watched():
            return self._inner.read(max_bytes, timeout)

    def write(self, buffer: bytes, timeout: float | None = None) -> None:
        timeout = self._clamp(timeout, httpcore2.WriteTimeout)
        with self._watched():
            self._inner.write(buffer, timeout)

    def close(self) -> None:
        self._inner.close()

    def start_tls(self, ssl_context: Any, server_hostname: str | None = None,
                  timeout: float | None = None) -> httpcore2.NetworkStream:
        return _DeadlineStream(self._inner.start_tls(ssl_context, server_hostname,
                                                     self._clamp(timeout, httpcore2.ConnectTimeout)))

    def get_extra_info(self, info: str) -> Any:
        return self._inner.get_extra_info(info)


class DeadlineBackend(httpcore2.NetworkBackend):
    """httpcore2's network backend, every stream bounded by the thread's `deadline_scope`."""

    def __init__(self, inner: httpcore2.NetworkBackend | None = None):
        self._inner = inner or httpcore2.SyncBackend()

    def connect_tcp(self, host: str, port: int, timeout: float | None = None, local_address: str | None = None,
                    socket_options: Any = None) -> httpcore2.NetworkStream:
        timeout = _DeadlineStream._clamp(timeout, httpcore2.ConnectTimeout)
        return _DeadlineStream(self._inner.connect_tcp(host, port, timeout, local_address, socket_options))

    def connect_unix_socket(self, path: str, timeout: float | None = None,
                            socket_options: Any = None) -> httpcore2.NetworkStream:
        return _DeadlineStream(self._inner.connect_unix_socket(path, timeout, socket_options))

    def sleep(self, seconds: float) -> None:
        self._inner.sleep(seconds)


class PinnedBackend(httpcore2.NetworkBackend):
    """Connects a host name only to the address the URL policy checked for it (`pins`: (host, port) ->
    address), so no second lookup happens for DNS rebinding to exploit. Any other host or port (a redirect
    elsewhere) is refused. TLS still verifies the host name: httpcore gives the name, not the address, as SNI."""

    def __init__(self, pins: Mapping[tuple[str, int], str], inner: httpcore2.NetworkBackend | None = None):
        self._pins = {(_canonical_host(host), port): address for (host, port), address in pins.items()}
        self._inner = inner or httpcore2.SyncBackend()

    def connect_tcp(self, host: str, port: int, timeout: float | None = None, local_address: str | None = None,
                    socket_options: Any = None) -> httpcore2.NetworkStream:
        address = self._pins.get((_canonical_host(host), port))
        if address is None:
            raise httpcore2.ConnectError(f"{host}:{port} was not checked by the URL policy")
        return self._inner.connect_tcp(address, port, timeout, local_address, socket_options)

    def connect_unix_socket(self, path: str, timeout: float | None = None,
                            socket_options: Any = None) -> httpcore2.NetworkStream:
        raise httpcore2.ConnectError("a pinned client connects only to checked addresses")

    def sleep(self, seconds: float) -> None:
        self._inner.sleep(seconds)


def bound_by_deadlines(transport: Any, pins: Mapping[tuple[str, int], str] | None = None) -> Any:
    """An httpx2 transport whose connections obey `deadline_scope` (its pool's network backend wrapped);
    with `pins`, it also connects only to those checked addresses (`PinnedBackend`)."""
    pool = getattr(transport, "_pool", None)
    if pool is not None and hasattr(pool, "_network_backend") and not isinstance(pool._network_backend,
                                                                                 DeadlineBackend):
        inner = pool._network_backend
        pool._network_backend = DeadlineBackend(PinnedBackend(pins, inner) if pins is not None else inner)
    return transport
