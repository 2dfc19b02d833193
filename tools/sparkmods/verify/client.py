"""HTTP to a vLLM OpenAI server with the standard library only.

Every exchange can be handed to a recorder, which is how `capture` turns a live server into a
replayable test scenario: what verify asked and what the server answered, byte for byte.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from typing import Any, Callable, Optional

from sparkmods.errors import SparkmodsError

DEFAULT_TIMEOUT_S = 30.0


class ServerUnreachable(SparkmodsError):
    """No HTTP answer at all: nothing can be judged (exit 2)."""


@dataclass(frozen=True)
class Exchange:
    """One request and the server's answer (any status)."""

    method: str
    path: str
    request: Optional[Any]
    status: int
    body: str

    def json(self) -> Any:
        """The body as JSON; a body that is not JSON is an input error naming the path."""
        try:
            return json.loads(self.body)
        except ValueError:
            raise SparkmodsError(f"{self.path}: the server answered {self.status} with a body that is not "
                                 f"JSON: {self.body[:80]!r}") from None

    @property
    def ok(self) -> bool:
        return 200 <= self.status < 300


Recorder = Callable[[Exchange], None]


class Server:
    """The server at a base URL such as http://127.0.0.1:8000."""

    def __init__(self, url: str, timeout: float = DEFAULT_TIMEOUT_S, recorder: Optional[Recorder] = None,
                 api_key: Optional[str] = None) -> None:
        parsed = urllib.parse.urlsplit(url)
        if parsed.scheme not in ("http", "https") or not parsed.netloc:
            raise SparkmodsError(f"--url {url!r}: expected http://HOST:PORT")
        self.url = url.rstrip("/")
        self.timeout = timeout
        self.recorder = recorder
        self.api_key = api_key

    def get(self, path: str) -> Exchange:
        return self._send("GET", path, None)

    def post(self, path: str, payload: Any) -> Exchange:
        return self._send("POST", path, payload)

    def _send(self, method: str, path: str, payload: Optional[Any]) -> Exchange:
        data = None if payload is None else json.dumps(payload).encode("utf-8")
        request = urllib.request.Request(self.url + path, data=data, method=method)
        if data is not None:
            request.add_header("Content-Type", "application/json")
        if self.api_key:
            request.add_header("Authorization", f"Bearer {self.api_key}")
        try:
            with urllib.request.urlopen(request, timeout=self.timeout) as response:
                status, raw = response.status, response.read()
        except urllib.error.HTTPError as exc:
            status, raw = exc.code, exc.read()
        except OSError as exc:  # URLError and socket timeouts are OSErrors
            reason = getattr(exc, "reason", exc)
            raise ServerUnreachable(f"cannot reach {self.url} ({method} {path}): {reason}; "
                                    "is `vllm serve` running there?") from None
        exchange = Exchange(method, path, payload, status, raw.decode("utf-8", errors="replace"))
        if self.recorder is not None:
            self.recorder(exchange)
        return exchange
