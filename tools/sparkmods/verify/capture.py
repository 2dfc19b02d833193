"""Scenario folders: what a live server answered to verify, written down so it can be replayed.

`sparkmods verify --record DIR` writes one; the tests replay each folder from a loopback server.
Layout (a missing file means the server answered 404 there):

  models.json       body of GET /v1/models
  metrics.txt       body of the last GET /metrics
  tokenize.json     [{"request": {...}, "status": N, "response": {...}}, ...] for POST /tokenize,
                    answered by matching the request body exactly
  completions.json  {"status": N, "response": {...}}: the answer to every POST /v1/completions
  server.log        the server log verify read (--log or --container)
  expect.json       {"args": [...], "exit": N, "mods": {MOD: VERDICT}}: verify's extra arguments
                    and its outcome; review it before committing a captured scenario
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

from sparkmods.errors import SparkmodsError
from sparkmods.verify.client import Exchange

MODELS, METRICS, TOKENIZE, COMPLETIONS, LOG, EXPECT = (
    "models.json", "metrics.txt", "tokenize.json", "completions.json", "server.log", "expect.json")

Answer = Tuple[int, str, bytes]


@dataclass
class Recorder:
    """Collects every exchange of a verify run (pass it to `Server(recorder=...)`)."""

    exchanges: List[Exchange] = field(default_factory=list)

    def __call__(self, exchange: Exchange) -> None:
        self.exchanges.append(exchange)

    def last(self, method: str, path: str) -> Optional[Exchange]:
        return next((e for e in reversed(self.exchanges) if (e.method, e.path) == (method, path)), None)


def _json_or_text(body: str) -> Any:
    try:
        return json.loads(body)
    except ValueError:
        return body


def write_scenario(folder: Path, recorder: Recorder, log_text: Optional[str], args: Sequence[str],
                   exit_code: int, verdicts: Dict[str, str]) -> None:
    """Write the folder (created if needed; the files named above are replaced)."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
        models, metrics = recorder.last("GET", "/v1/models"), recorder.last("GET", "/metrics")
        if models is not None and models.ok:
            (folder / MODELS).write_text(models.body, encoding="utf-8")
        if metrics is not None and metrics.ok:
            (folder / METRICS).write_text(metrics.body, encoding="utf-8")
        tokenize = [{"request": e.request, "status": e.status, "response": _json_or_text(e.body)}
                    for e in recorder.exchanges if (e.method, e.path) == ("POST", "/tokenize")]
        if tokenize:
            (folder / TOKENIZE).write_text(json.dumps(tokenize, indent=2) + "\n", encoding="utf-8")
        completion = recorder.last("POST", "/v1/completions")
        if completion is not None:
            doc = {"status": completion.status, "response": _json_or_text(completion.body)}
            (folder / COMPLETIONS).write_text(json.dumps(doc, indent=2) + "\n", encoding="utf-8")
        if log_text is not None:
            (folder / LOG).write_text(log_text, encoding="utf-8")
        expect = {"args": list(args), "exit": exit_code, "mods": verdicts}
        (folder / EXPECT).write_text(json.dumps(expect, indent=2) + "\n", encoding="utf-8")
    except OSError as exc:
        raise SparkmodsError(f"--record {folder}: cannot write the scenario: {exc.strerror or exc}") from None


def _canonical(payload: Any) -> str:
    return json.dumps(payload, sort_keys=True)


@dataclass(frozen=True)
class Scenario:
    """A scenario folder, answering requests as the recorded server did."""

    folder: Path

    def _file(self, name: str) -> Optional[bytes]:
        path = self.folder / name
        return path.read_bytes() if path.is_file() else None

    def _json(self, name: str) -> Any:
        raw = self._file(name)
        return None if raw is None else json.loads(raw)

    @property
    def expect(self) -> Dict[str, Any]:
        return self._json(EXPECT) or {}

    @property
    def log_path(self) -> Optional[Path]:
        return self.folder / LOG if (self.folder / LOG).is_file() else None

    def answer(self, method: str, path: str, body: Optional[bytes]) -> Answer:
        """(status, content type, body) for one request."""
        if (method, path) == ("GET", "/v1/models"):
            return self._static(MODELS, "application/json")
        if (method, path) == ("GET", "/metrics"):
            return self._static(METRICS, "text/plain; version=0.0.4; charset=utf-8")
        if (method, path) == ("POST", "/tokenize"):
            wanted = _canonical(json.loads(body or b"null"))
            for item in self._json(TOKENIZE) or []:
                if _canonical(item["request"]) == wanted:
                    return self._reply(item["status"], item["response"])
            return self._reply(404, {"error": f"{self.folder.name}/{TOKENIZE}: no recorded answer to this request"})
        if (method, path) == ("POST", "/v1/completions"):
            doc = self._json(COMPLETIONS)
            if doc is not None:
                return self._reply(doc["status"], doc["response"])
        return self._reply(404, {"error": f"{method} {path}: nothing recorded"})

    def _static(self, name: str, content_type: str) -> Answer:
        raw = self._file(name)
        return (200, content_type, raw) if raw is not None else self._reply(404, {"error": f"no {name}"})

    @staticmethod
    def _reply(status: int, doc: Any) -> Answer:
        return status, "application/json", json.dumps(doc).encode("utf-8")


def load_scenario(folder: Path) -> Scenario:
    if not (folder / EXPECT).is_file():
        raise SparkmodsError(f"{folder}: not a verify scenario (no {EXPECT})")
    return Scenario(folder)
