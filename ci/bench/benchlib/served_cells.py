"""Measuring one served cell: stream a batch of requests at once and count the tokens decoded
while every one of them decodes.

A cell streams `batch` requests of `context` random prompt tokens through vLLM's OpenAI completions
endpoint (usage in every chunk) and counts the tokens all of them decode while every one is
decoding (the window after the last prefill), so prefill never dilutes the rate. A cell's windows
are repeated with fresh prompts and the median kept, each beside how busy the host's CPUs were
while it ran; servers sharing a GPU take a cell's windows in turn. ci/bench/bench_served.py plans
the cells and starts the servers.
"""

from __future__ import annotations

import http.client
import json
import random
import statistics
import threading
import time
from dataclasses import dataclass, field
from typing import Sequence

from benchlib.hostload import busy_share, cpu_ticks
from benchlib.qwen35_shapes import FIRST_SPECIAL_ID

SERVED_NAME = "qwen35"  # --served-model-name of every benchmark server
CELL_TIMEOUT_S = 900.0


@dataclass(frozen=True)
class Cell:
    """One measurement of a configuration's plan: its phase, shape and token budget, or why it is skipped."""

    phase: str  # "first" (right after start) or "steady"
    batch: int
    context: int
    max_tokens: int
    skip: str | None = None


@dataclass
class Stream:
    """One streamed request: when it was sent and (time, tokens decoded so far) per chunk."""

    sent: float = 0.0
    samples: list[tuple[float, int]] = field(default_factory=list)
    ended: bool = False
    error: str | None = None


def _count_at(samples: Sequence[tuple[float, int]], t: float) -> int:
    return max((n for when, n in samples if when <= t), default=0)


def window_rate(streams: Sequence[Stream]) -> tuple[float | None, float | None]:
    """(aggregate decode tok/s while every stream decodes, mean time to first token).

    The window opens at the last stream's first token and closes at the first stream's last
    sample; tok/s is every stream's tokens inside it over its length (None when it is empty).
    """
    if not streams or any(not s.samples for s in streams):
        return None, None
    ttft = sum(s.samples[0][0] - s.sent for s in streams) / len(streams)
    start = max(s.samples[0][0] for s in streams)
    end = min(s.samples[-1][0] for s in streams)
    if end <= start:
        return None, ttft
    tokens = sum(_count_at(s.samples, end) - _count_at(s.samples, start) for s in streams)
    return tokens / (end - start), ttft


def _stream(port: int, payload: dict, stream: Stream, stop: threading.Event) -> None:
    """POST a streaming completion and record usage.completion_tokens per chunk until stop or end."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=CELL_TIMEOUT_S)
    try:
        stream.sent = time.monotonic()
        conn.request("POST", "/v1/completions", body=json.dumps(payload), headers={"Content-Type": "application/json"})
        answer = conn.getresponse()
        if answer.status != 200:
            stream.error = f"HTTP {answer.status}: {answer.read(300).decode(errors='replace')}"
            return
        for line in answer:
            if stop.is_set():
                break
            if not line.startswith(b"data: "):
                continue
            body = line[6:].strip()
            if body == b"[DONE]":
                break
            usage = json.loads(body).get("usage") or {}
            if usage.get("completion_tokens"):
                stream.samples.append((time.monotonic(), usage["completion_tokens"]))
    except (OSError, http.client.HTTPException, ValueError) as exc:
        stream.error = f"{type(exc).__name__}: {exc}"
    finally:
        stream.ended = True
        conn.close()


def prompt(length: int, rng: random.Random) -> list[int]:
    """Random ordinary token ids (below the specials): no two prompts share a prefix."""
    return [rng.randrange(1, FIRST_SPECIAL_ID) for _ in range(length)]


def open_streams(port: int, batch: int, context: int, max_tokens: int, seed: int
                  ) -> tuple[list[Stream], list[threading.Thread], threading.Event]:
    """Start `batch` streamed requests of `context` random prompt tokens at once."""
    rng = random.Random(seed)
    streams = [Stream() for _ in range(batch)]
    stop = threading.Event()
    threads = []
    for s in streams:
        payload = {"model": SERVED_NAME, "prompt": prompt(context, rng), "max_tokens": max_tokens,
                   "temperature": 0.0, "ignore_eos": True, "stream": True,
                   "stream_options": {"include_usage": True, "continuous_usage_stats": True}}
        threads.append(threading.Thread(target=_stream, args=(port, payload, s, stop), daemon=True))
    for t in threads:
        t.start()
    return streams, threads, stop


def close_streams(threads: Sequence[threading.Thread], stop: threading.Event) -> None:
    stop.set()
    for t in threads:
        t.join(timeout=30)


def run_cell(port: int, cell: Cell, gen: int, seed: int) -> tuple[float | None, float | None, str | None]:
    """Stream cell.batch requests at once; close them once each decoded `gen` tokens inside the window."""
    streams, threads, stop = open_streams(port, cell.batch, cell.context, cell.max_tokens, seed)
    deadline = time.monotonic() + CELL_TIMEOUT_S
    while time.monotonic() < deadline and not all(s.ended for s in streams):
        if all(s.samples for s in streams):
            start = max(s.samples[0][0] for s in streams)
            if all(s.samples[-1][1] - _count_at(s.samples, start) >= gen for s in streams):
                break
        time.sleep(0.02)
    close_streams(threads, stop)
    errors = [s.error for s in streams if s.error]
    rate, ttft = window_rate(streams)
    note = errors[0] if errors else None
    if note is None and time.monotonic() >= deadline:
        note = f"timed out after {CELL_TIMEOUT_S:.0f} s"
    elif note is None and rate is None:
        note = "no window where every request decoded (a request ended before the last prefill)"
    return rate, ttft, note


@dataclass
class Windows:
    """A cell's windows: the median rate and time to first token, each window's rate and how busy
    the host's CPUs were during it (None where unknown), or the note of the window that failed."""

    rate: float | None
    ttft: float | None
    note: str | None
    rates: list[float]
    host_busy: list[float | None]


def interleaved_cell(ports: Sequence[int], cell: Cell, gen: int, index: int, repeats: int) -> list[Windows]:
    """A cell's windows on each server: `repeats` rounds of one window per server in turn (fresh
    prompts each round, the same for every server in it). One window is short (128 tokens at batch
    1 is under a second), so a single stall can move a cell: the median is what steady means. Servers
    sharing a GPU meet the same stretches of the machine, so a slow one falls on all of them rather
    than on whichever ran then. A window that fails ends its server's cell with the note and no
    rate; the other servers go on."""
    rates: list[list[float]] = [[] for _ in ports]
    ttfts: list[list[float]] = [[] for _ in ports]
    busy: list[list[float | None]] = [[] for _ in ports]
    failed: list[Windows | None] = [None for _ in ports]
    for k in range(repeats):
        for i, port in enumerate(ports):
            if failed[i] is not None:
                continue
            before = cpu_ticks()
            rate, ttft, note = run_cell(port, cell, gen, seed=index * 1000 + k)
            if note is not None or rate is None or ttft is None:
                failed[i] = Windows(None, ttft, note, rates[i], busy[i])
                continue
            busy[i].append(busy_share(before, cpu_ticks()))
            rates[i].append(rate)
            ttfts[i].append(ttft)
    return [done or Windows(statistics.median(r), statistics.median(t), None, r, b)
            for done, r, t, b in zip(failed, rates, ttfts, busy)]
