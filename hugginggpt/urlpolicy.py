"""Outbound URL policy for URLs that a request names (plan arguments, `img_url`, result URLs).

A user-named URL may only reach public addresses: loopback, private, link-local, CGNAT, multicast,
reserved and unspecified addresses are refused, including their IPv6 forms that embed an IPv4 address
(`::ffff:169.254.169.254`, 6to4, NAT64). The host is resolved once and the connection goes to the very
address that was checked (no second lookup for DNS rebinding to exploit); every redirect hop is checked
again. `url_allowlist` (host names or CIDRs) opens exceptions. Endpoints named by the config (LLM,
models server, hosted inference) never pass through here: they are trusted.
"""

from __future__ import annotations

import ipaddress
import socket
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from urllib.parse import urljoin, urlsplit

import urllib3

from .errors import ResourceError

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
Network = ipaddress.IPv4Network | ipaddress.IPv6Network
Resolver = Callable[[str, int], list[str]]

MAX_REDIRECTS = 5
_CGNAT = ipaddress.ip_network("100.64.0.0/10")
_NAT64 = (ipaddress.ip_network("64:ff9b::/96"), ipaddress.ip_network("64:ff9b:1::/48"))
_IPV4_COMPATIBLE = ipaddress.ip_network("::/96")


class URLRefused(ResourceError):
    """The URL's target is not allowed by the outbound URL policy."""


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
        ("non-global", not addr.is_global),
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
                networks.append(ipaddress.ip_network(entry.strip("[]"), strict=False))
            except ValueError:
                hosts.add(_canonical_host(entry))
        return cls(frozenset(hosts), tuple(networks), resolver or system_resolver)

    def _allowed_by_network(self, addr: IPAddress) -> bool:
        inner = embedded_ipv4(addr)
        return any(addr in net or (inner is not None and inner in net) for net in self.allow_networks)

    def check(self, url: str) -> Target:
        """Resolve once and check every address; raises URLRefused with the reason."""
        parts = urlsplit(url)
        scheme = parts.scheme.lower()
        if scheme not in ("http", "https"):
            raise URLRefused(f"refusing {url!r}: only http(s) URLs can be fetched")
        if parts.username is not None or parts.password is not None:
            raise URLRefused(f"refusing {url!r}: credentials in URLs are not accepted")
        try:
            port = parts.port or (443 if scheme == "https" else 80)
        except ValueError:
            raise URLRefused(f"refusing {url!r}: invalid port") from None
        host = _canonical_host(parts.hostname or "")
        if not host:
            raise URLRefused(f"refusing {url!r}: no host")
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
                    raise URLRefused(f"refusing to fetch {url!r}: {host} resolves to {reason}; "
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
    deadline = time.monotonic() + timeout
    for _ in range(MAX_REDIRECTS + 1):
        target = policy.check(url)
        left = deadline - time.monotonic()
        if left <= 0:
            raise ResourceError(f"fetching {url!r} took longer than {timeout:.0f}s")
        pool, resp = _open(target, left, proxy, headers or {})
        try:
            if resp.status in (301, 302, 303, 307, 308) and resp.headers.get("Location"):
                url = urljoin(url, resp.headers["Location"])
                continue
            if resp.status >= 400:
                raise ResourceError(f"fetching {target.url!r} failed: HTTP {resp.status}")
            return Fetched(_read_limited(resp, target.url, max_bytes, deadline, timeout),
                           (resp.headers.get("Content-Type") or "").split(";")[0].strip(), target.url)
        finally:
            resp.release_conn()
            pool.close()
    raise ResourceError(f"fetching {url!r}: more than {MAX_REDIRECTS} redirects")


def _open(target: Target, timeout: float, proxy: str | None,
          headers: dict[str, str]) -> tuple[urllib3.PoolManager | urllib3.HTTPConnectionPool, urllib3.BaseHTTPResponse]:
    limits = urllib3.Timeout(connect=min(timeout, 10.0), read=timeout)
    send = {"User-Agent": "hugginggpt-server", **headers, "Host": target.host_header}
    try:
        if proxy:  # the proxy connects; we checked the name it will resolve (pinning is the proxy's job)
            manager = urllib3.ProxyManager(proxy, timeout=limits, retries=False)
            return manager, manager.urlopen("GET", target.url, headers=send, redirect=False, preload_content=False)
        if target.scheme == "https":
            pool: urllib3.HTTPConnectionPool = urllib3.HTTPSConnectionPool(
                target.address, target.port, timeout=limits, retries=False, maxsize=1,
                server_hostname=target.host, assert_hostname=target.host, cert_reqs="CERT_REQUIRED")
        else:
            pool = urllib3.HTTPConnectionPool(target.address, target.port, timeout=limits, retries=False, maxsize=1)
        return pool, pool.urlopen("GET", target.request_target, headers=send, redirect=False,
                                  preload_content=False, assert_same_host=False)
    except urllib3.exceptions.HTTPError as exc:
        raise ResourceError(f"fetching {target.url!r} failed: {exc.__class__.__name__}") from None


def _read_limited(resp: urllib3.BaseHTTPResponse, url: str, max_bytes: int, deadline: float, timeout: float) -> bytes:
    limit_text = f"{url!r} is larger than the {max_bytes // (1024 * 1024)} MiB limit"
    declared = resp.headers.get("Content-Length")
    if declared and declared.isdigit() and int(declared) > max_bytes:
        raise ResourceError(limit_text)
    chunks, size = [], 0
    try:
        for chunk in resp.stream(65536):
            size += len(chunk)
            if size > max_bytes:
                raise ResourceError(limit_text)
            if time.monotonic() > deadline:
                raise ResourceError(f"fetching {url!r} took longer than {timeout:.0f}s")
            chunks.append(chunk)
    except urllib3.exceptions.HTTPError as exc:
        raise ResourceError(f"fetching {url!r} failed: {exc.__class__.__name__}") from None
    return b"".join(chunks)
