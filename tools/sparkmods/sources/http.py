"""Small HTTP layer on http.client: GETs and byte-range GETs over kept-alive connections.

Range requests are how a 300 MB wheel is read for a few hundred KB. A TLS handshake costs
more than a small range request, so connections are pooled per host (at most
MAX_PER_HOST open at once; a request waits for a free one rather than opening more).
Everything is counted in `stats`. A server that answers a range request with 200 (whole
body) raises RangeIgnored carrying the unread response, so the caller can stream that
body to disk instead of asking again.
"""

from __future__ import annotations

import gzip
import http.client
import re
import ssl
import threading
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Dict, List, Optional, Tuple
from urllib.parse import urljoin, urlsplit

from sparkmods import __version__
from sparkmods.errors import SparkmodsError
from sparkmods.sources.fetchstats import stats

USER_AGENT = f"sparkmods/{__version__}"
TIMEOUT_S = 60.0
RETRIES = 2  # extra attempts after a connection error, timeout or 5xx
MAX_PER_HOST = 8
FETCH_THREADS = 16
MAX_REDIRECTS = 5

_CONTENT_RANGE = re.compile(r"^bytes (\d+)-(\d+)/(\d+|\*)$")
_REDIRECTS = (301, 302, 303, 307, 308)
_NETWORK_ERRORS = (OSError, http.client.HTTPException)  # socket, TLS, timeouts, bad status lines
_executor: Optional[ThreadPoolExecutor] = None
_executor_lock = threading.Lock()


def pool() -> ThreadPoolExecutor:
    """The shared pool for leaf fetches (tasks never wait on each other, so no deadlock)."""
    global _executor
    with _executor_lock:
        if _executor is None:
            _executor = ThreadPoolExecutor(max_workers=FETCH_THREADS, thread_name_prefix="sparkmods-fetch")
        return _executor


Key = Tuple[str, str, int]  # scheme, host, port


class _Connections:
    """Idle kept-alive connections per host, and a cap on how many are open at once."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._idle: Dict[Key, List[http.client.HTTPConnection]] = {}
        self._open: Dict[Key, int] = {}

    def acquire(self, key: Key) -> Tuple[http.client.HTTPConnection, bool]:
        """(connection, reused); blocks while MAX_PER_HOST connections to that host are busy."""
        with self._cond:
            while not self._idle.get(key) and self._open.get(key, 0) >= MAX_PER_HOST:
                self._cond.wait()
            if self._idle.get(key):
                return self._idle[key].pop(), True
            self._open[key] = self._open.get(key, 0) + 1
        return _new_connection(key), False

    def release(self, key: Key, conn: http.client.HTTPConnection, reusable: bool) -> None:
        if not reusable:
            conn.close()
        with self._cond:
            if reusable:
                self._idle.setdefault(key, []).append(conn)
            else:
                self._open[key] -= 1
            self._cond.notify()

    def forget(self, key: Key) -> None:
        """A connection now owned by a streaming caller: it no longer counts against the cap."""
        with self._cond:
            self._open[key] -= 1
            self._cond.notify()


_connections = _Connections()
_ssl_context: Optional[ssl.SSLContext] = None


def _new_connection(key: Key) -> http.client.HTTPConnection:
    global _ssl_context
    scheme, host, port = key
    proxy = _proxy_for(scheme, host)
    if scheme == "https":
        if _ssl_context is None:
            _ssl_context = ssl.create_default_context()
        if proxy:
            conn = http.client.HTTPSConnection(proxy[0], proxy[1], timeout=TIMEOUT_S, context=_ssl_context)
            conn.set_tunnel(host, port)
            return conn
        return http.client.HTTPSConnection(host, port, timeout=TIMEOUT_S, context=_ssl_context)
    return http.client.HTTPConnection(*(proxy or (host, port)), timeout=TIMEOUT_S)


def _proxy_for(scheme: str, host: str) -> Optional[Tuple[str, int]]:
    """(host, port) of the $http_proxy/$https_proxy proxy for this host, honouring $no_proxy."""
    proxy = urllib.request.getproxies().get(scheme)
    if not proxy or urllib.request.proxy_bypass(host):
        return None
    parts = urlsplit(proxy if "://" in proxy else f"http://{proxy}")
    return parts.hostname or "", parts.port or 80


@dataclass
class Response:
    url: str  # final URL after redirects
    status: int
    headers: Dict[str, str]  # lower-case names
    body: bytes


class RangeIgnored(Exception):
    """The server sent the whole file (200) for a range request; `response` is still unread."""

    def __init__(self, url: str, response: http.client.HTTPResponse) -> None:
        super().__init__(f"{url}: server ignored the Range header")
        self.url = url
        self.response = response


class _Open:
    """An answered request: the response plus the connection to give back once it is read."""

    def __init__(self, url: str, key: Key, conn: http.client.HTTPConnection,
                 response: http.client.HTTPResponse) -> None:
        self.url, self.key, self.conn, self.response = url, key, conn, response

    def read(self) -> bytes:
        started = time.monotonic()
        try:
            body = self.response.read()
        except _NETWORK_ERRORS as exc:
            _connections.release(self.key, self.conn, reusable=False)
            raise SparkmodsError(f"{self.url}: connection lost while reading ({exc})") from None
        stats.add(nbytes=len(body), seconds=time.monotonic() - started)
        _connections.release(self.key, self.conn, reusable=not self.response.will_close)
        return body

    def detach(self) -> http.client.HTTPResponse:
        """Hand the response to a caller that streams it; the connection closes with it."""
        _connections.forget(self.key)
        return self.response

    def header(self, name: str) -> Optional[str]:
        return self.response.getheader(name)


def _open(url: str, headers: Dict[str, str]) -> _Open:
    """Send a GET (following redirects); errors and HTTP >= 400 become SparkmodsError."""
    for _ in range(MAX_REDIRECTS + 1):
        answer = _send(url, headers)
        status = answer.response.status
        if status in _REDIRECTS and answer.header("Location"):
            answer.read()
            url = urljoin(url, answer.header("Location"))
            continue
        if status >= 400:
            answer.read()
            raise SparkmodsError(f"{url}: HTTP {status} {answer.response.reason}")
        return answer
    raise SparkmodsError(f"{url}: more than {MAX_REDIRECTS} redirects")


def _send(url: str, headers: Dict[str, str]) -> _Open:
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise SparkmodsError(f"{url}: not an http(s) URL")
    key: Key = (parts.scheme, parts.hostname, parts.port or (443 if parts.scheme == "https" else 80))
    direct_proxy = parts.scheme == "http" and _proxy_for("http", parts.hostname)
    target = url if direct_proxy else (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    all_headers = {"User-Agent": USER_AGENT, "Accept-Encoding": "identity", **headers}
    attempt = 0
    while True:
        conn, reused = _connections.acquire(key)
        started = time.monotonic()
        try:
            conn.request("GET", target, headers=all_headers)
            response = conn.getresponse()
        except _NETWORK_ERRORS as exc:
            _connections.release(key, conn, reusable=False)
            stats.add(seconds=time.monotonic() - started)
            if reused:
                continue  # the server closed an idle kept-alive connection: not a real failure
            attempt += 1
            if attempt > RETRIES:
                raise SparkmodsError(f"cannot fetch {url}: {exc or type(exc).__name__} "
                                     f"(use --offline to work from the cache)") from None
            continue
        stats.add(requests=1, seconds=time.monotonic() - started)
        answer = _Open(url, key, conn, response)
        if response.status >= 500 and attempt < RETRIES:
            answer.read()
            attempt += 1
            continue
        return answer


def get(url: str, accept: Optional[str] = None) -> Response:
    """A plain GET, body read fully (gzip accepted: index pages shrink about tenfold)."""
    answer = _open(url, {"Accept-Encoding": "gzip", **({"Accept": accept} if accept else {})})
    body = answer.read()
    headers = {k.lower(): v for k, v in answer.response.getheaders()}
    if headers.get("content-encoding", "").lower() == "gzip":
        try:
            body = gzip.decompress(body)
        except (OSError, EOFError) as exc:
            raise SparkmodsError(f"{answer.url}: bad gzip body ({exc})") from None
    return Response(answer.url, answer.response.status, headers, body)


def _parse_content_range(url: str, value: Optional[str]) -> Tuple[int, int, int]:
    match = _CONTENT_RANGE.match((value or "").strip())
    if not match or match.group(3) == "*":
        raise SparkmodsError(f"{url}: bad Content-Range {value!r} in a 206 answer")
    return int(match.group(1)), int(match.group(2)) + 1, int(match.group(3))


def get_range(url: str, first: Optional[int], end: int) -> Tuple[int, int, bytes]:
    """Bytes [first, end) of url, or the last `end` bytes when first is None.

    Returns (start, total_size, data). Raises RangeIgnored when the server answers 200.
    """
    spec = f"bytes=-{end}" if first is None else f"bytes={first}-{end - 1}"
    answer = _open(url, {"Range": spec})
    status = answer.response.status
    if status == 200:
        raise RangeIgnored(answer.url, answer.detach())
    data = answer.read()
    if status != 206:
        raise SparkmodsError(f"{url}: HTTP {status} to a range request")
    start, stop, total = _parse_content_range(url, answer.header("Content-Range"))
    if len(data) != stop - start or (first is not None and (start, stop) != (first, end)):
        raise SparkmodsError(f"{url}: asked for {spec}, got bytes {start}-{stop - 1} ({len(data)} bytes)")
    return start, total, data
