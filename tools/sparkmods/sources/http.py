"""Small HTTP layer on http.client: GETs and byte-range GETs over kept-alive connections.

Range requests are how a 300 MB wheel is read for a few hundred KB. A TLS handshake costs
more than a small range request, so connections are pooled per host (at most
MAX_PER_HOST open at once; a request waits for a free one rather than opening more).
Everything is counted in `stats`. A server that answers a range request with 200 (whole
body) raises RangeIgnored carrying the unread body as a Stream, so the caller can stream
it to disk instead of asking again.

A server is not trusted to be quick or small: every request has an overall deadline
($SPARKMODS_HTTP_DEADLINE seconds, default 300; the socket timeout alone restarts with every
byte, so a server trickling one byte a second would hold a caller forever), enforced by a
watchdog that shuts the socket; a body is never read past what was asked for (the span of a
range request, MAX_PAGE_BYTES for a page), and a gzip page is decoded to at most MAX_PAGE_BYTES.
"""

from __future__ import annotations

import http.client
import math
import os
import re
import socket
import ssl
import threading
import time
import urllib.request
import zlib
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Dict, List, Optional, Tuple
from urllib.parse import urljoin, urlsplit

from sparkmods import __version__
from sparkmods.errors import SparkmodsError, Unreachable
from sparkmods.sources.fetchstats import stats

USER_AGENT = f"sparkmods/{__version__}"
TIMEOUT_S = 60.0
RETRIES = 2  # extra attempts after a connection error, timeout or 5xx
MAX_PER_HOST = 8
FETCH_THREADS = 16
MAX_REDIRECTS = 5
DEADLINE_ENV = "SPARKMODS_HTTP_DEADLINE"
DEFAULT_DEADLINE_S = 300.0  # a whole 500 MB wheel (servers without Range) at >= 2 MB/s
MAX_PAGE_BYTES = 64 * 1024 * 1024  # PyPI's vllm page is well under 1 MB decoded

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


def shutdown() -> None:
    """End the shared pool's threads, after the fetches in flight (the next fetch starts a new
    pool). A finished command leaves them idle, and the program's fast exit (cli.entry) waits
    for any thread still there."""
    global _executor
    with _executor_lock:
        executor, _executor = _executor, None
    if executor is not None:
        executor.shutdown(wait=True)


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


def deadline_s() -> float:
    """$SPARKMODS_HTTP_DEADLINE (read at call time), else DEFAULT_DEADLINE_S."""
    raw = os.environ.get(DEADLINE_ENV, "").strip()
    if not raw:
        return DEFAULT_DEADLINE_S
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not (value > 0 and math.isfinite(value)):
        raise SparkmodsError(f"{DEADLINE_ENV}={raw[:40]!r}: want a number of seconds > 0, "
                             f"e.g. {DEFAULT_DEADLINE_S:g}")
    return value


class _Watchdog:
    """Shuts a connection's socket once its request passes the deadline.

    Shutting (not closing) the socket wakes a reader blocked in recv with EOF, whatever layer
    it is in (status line, headers, body, TLS). The plain-socket shutdown is called even on
    TLS sockets: SSLSocket.shutdown would drop the TLS state under the reading thread.
    """

    def __init__(self, conn: http.client.HTTPConnection, seconds: float) -> None:
        self.fired = False
        self._conn = conn
        self._lock = threading.Lock()
        self._cancelled = False
        self._arm(seconds)

    def _arm(self, seconds: float) -> None:
        self._timer = threading.Timer(max(seconds, 0.0), self._fire)
        self._timer.daemon = True
        self._timer.start()

    def _fire(self) -> None:
        with self._lock:
            if self._cancelled:
                return
            self.fired = True
            sock = self._conn.sock
            if sock is None:  # still connecting: look again in a moment
                self._arm(0.05)
                return
        try:
            socket.socket.shutdown(sock, socket.SHUT_RDWR)
        except OSError:
            pass

    def cancel(self) -> bool:
        """Stop watching; True when it had already fired (the connection is then dead)."""
        with self._lock:
            self._cancelled = True
            self._timer.cancel()
            return self.fired


@dataclass
class Response:
    url: str  # final URL after redirects
    status: int
    headers: Dict[str, str]  # lower-case names
    body: bytes


class _Open:
    """An answered request: the response, its watchdog, and the connection to give back once
    the body is read."""

    def __init__(self, url: str, key: Key, conn: http.client.HTTPConnection,
                 response: http.client.HTTPResponse, watchdog: _Watchdog, seconds: float) -> None:
        self.url, self.key, self.conn, self.response = url, key, conn, response
        self.watchdog, self.seconds = watchdog, seconds

    def late(self) -> SparkmodsError:
        return _late(self.url, self.seconds)

    def read(self, limit: int) -> bytes:
        """The whole body, refused when it is longer than limit bytes or past the deadline."""
        started = time.monotonic()
        declared = self.response.getheader("Content-Length", "")
        try:
            if declared.isdigit() and int(declared) > limit:
                raise SparkmodsError(f"{self.url}: the server sends {declared} bytes, more than the "
                                     f"{limit} asked for")
            body = self.response.read(limit + 1)
            if len(body) > limit:
                raise SparkmodsError(f"{self.url}: the server sends more than the {limit} bytes asked for")
        except _NETWORK_ERRORS as exc:
            self._give_back(reusable=False)
            if self.watchdog.fired:
                raise self.late() from None
            raise SparkmodsError(f"{self.url}: connection lost while reading ({exc})") from None
        except SparkmodsError:
            self._give_back(reusable=False)
            raise
        stats.add(nbytes=len(body), seconds=time.monotonic() - started)
        if self._give_back(reusable=not self.response.will_close):
            raise self.late()  # a close-delimited body cut short by the watchdog
        return body

    def _give_back(self, reusable: bool) -> bool:
        """Release the connection; True when the watchdog had fired."""
        fired = self.watchdog.cancel()
        _connections.release(self.key, self.conn, reusable=reusable and not fired)
        return fired

    def detach(self) -> "Stream":
        """Hand the body to a caller that streams it; the connection closes with it."""
        _connections.forget(self.key)
        return Stream(self)

    def header(self, name: str) -> Optional[str]:
        return self.response.getheader(name)


class Stream:
    """A response body read in chunks by its caller (a whole-wheel download), still under the
    request's deadline. Errors are SparkmodsError; close() when done."""

    def __init__(self, answer: _Open) -> None:
        self._answer = answer

    def read(self, size: int) -> bytes:
        try:
            chunk = self._answer.response.read(size)
        except _NETWORK_ERRORS as exc:
            if self._answer.watchdog.fired:
                raise self._answer.late() from None
            raise SparkmodsError(f"connection lost ({exc})") from None
        if self._answer.watchdog.fired:
            raise self._answer.late()
        return chunk

    def close(self) -> None:
        self._answer.watchdog.cancel()
        self._answer.response.close()


class RangeIgnored(Exception):
    """The server sent the whole file (200) for a range request; `stream` holds the unread body."""

    def __init__(self, url: str, stream: Stream) -> None:
        super().__init__(f"{url}: server ignored the Range header")
        self.url = url
        self.stream = stream


def _late(url: str, seconds: float) -> SparkmodsError:
    return SparkmodsError(f"{url}: no complete answer within {seconds:g} s (a stalled or trickling "
                          f"server; {DEADLINE_ENV} sets the limit)")


def _open(url: str, headers: Dict[str, str]) -> _Open:
    """Send a GET (following redirects) under one overall deadline; errors and HTTP >= 400
    become SparkmodsError."""
    seconds = deadline_s()
    deadline = time.monotonic() + seconds
    for _ in range(MAX_REDIRECTS + 1):
        answer = _send(url, headers, deadline, seconds)
        status = answer.response.status
        if status in _REDIRECTS and answer.header("Location"):
            answer.read(MAX_PAGE_BYTES)
            url = urljoin(url, answer.header("Location"))
            continue
        if status >= 400:
            answer.read(MAX_PAGE_BYTES)
            raise SparkmodsError(f"{url}: HTTP {status} {answer.response.reason}")
        return answer
    raise SparkmodsError(f"{url}: more than {MAX_REDIRECTS} redirects")


def _send(url: str, headers: Dict[str, str], deadline: float, seconds: float) -> _Open:
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise SparkmodsError(f"{url}: not an http(s) URL")
    key: Key = (parts.scheme, parts.hostname, parts.port or (443 if parts.scheme == "https" else 80))
    direct_proxy = parts.scheme == "http" and _proxy_for("http", parts.hostname)
    target = url if direct_proxy else (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    all_headers = {"User-Agent": USER_AGENT, "Accept-Encoding": "identity", **headers}
    attempt = 0
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            raise _late(url, seconds)
        conn, reused = _connections.acquire(key)
        watchdog = _Watchdog(conn, left)
        started = time.monotonic()
        try:
            conn.request("GET", target, headers=all_headers)
            response = conn.getresponse()
        except _NETWORK_ERRORS as exc:
            fired = watchdog.cancel()
            _connections.release(key, conn, reusable=False)
            stats.add(seconds=time.monotonic() - started)
            if fired:
                raise _late(url, seconds) from None
            if reused:
                continue  # the server closed an idle kept-alive connection: not a real failure
            attempt += 1
            if attempt > RETRIES:
                raise Unreachable(f"cannot fetch {url}: {exc or type(exc).__name__}") from None
            continue
        stats.add(requests=1, seconds=time.monotonic() - started)
        answer = _Open(url, key, conn, response, watchdog, seconds)
        if response.status >= 500 and attempt < RETRIES:
            answer.read(MAX_PAGE_BYTES)
            attempt += 1
            continue
        return answer


def gunzip(url: str, body: bytes, limit: int) -> bytes:
    """Decode a gzip body (several members allowed) to at most limit bytes: a gzip bomb is one
    line, not gigabytes of memory."""
    out = bytearray()
    data = body
    try:
        while data:
            decoder = zlib.decompressobj(16 + zlib.MAX_WBITS)
            while True:
                out += decoder.decompress(data, limit + 1 - len(out))
                if len(out) > limit:
                    raise SparkmodsError(f"{url}: the gzip body decodes to more than {limit} bytes; refusing it")
                data = decoder.unconsumed_tail
                if decoder.eof or not data:
                    break
            if not decoder.eof:
                raise SparkmodsError(f"{url}: bad gzip body (truncated)")
            data = decoder.unused_data
    except zlib.error as exc:
        raise SparkmodsError(f"{url}: bad gzip body ({exc})") from None
    return bytes(out)


def get(url: str, accept: Optional[str] = None) -> Response:
    """A plain GET, body read fully (gzip accepted: index pages shrink about tenfold)."""
    answer = _open(url, {"Accept-Encoding": "gzip", **({"Accept": accept} if accept else {})})
    body = answer.read(MAX_PAGE_BYTES)
    headers = {k.lower(): v for k, v in answer.response.getheaders()}
    if headers.get("content-encoding", "").lower() == "gzip":
        body = gunzip(answer.url, body, MAX_PAGE_BYTES)
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
    data = answer.read(end if first is None else end - first)
    if status != 206:
        raise SparkmodsError(f"{url}: HTTP {status} to a range request")
    start, stop, total = _parse_content_range(url, answer.header("Content-Range"))
    if len(data) != stop - start or (first is not None and (start, stop) != (first, end)):
        raise SparkmodsError(f"{url}: asked for {spec}, got bytes {start}-{stop - 1} ({len(data)} bytes)")
    return start, total, data
