"""How busy the host's CPUs were over an interval, from /proc/stat.

A served decode window on one GPU can be slowed by what else the host runs (another GPU's server
starting: weight loading, torch.compile), and a window's rate alone cannot say so. Two readings
around the window give the share of all CPU time that was busy in between.
"""

from __future__ import annotations

from pathlib import Path

PROC_STAT = Path("/proc/stat")
IDLE_FIELDS = (3, 4)  # idle and iowait among user nice system idle iowait irq softirq steal


def cpu_ticks(stat: Path = PROC_STAT) -> tuple[int, int] | None:
    """(busy, total) clock ticks of all CPUs since boot; None where /proc/stat is not there."""
    try:
        first = stat.read_text().splitlines()[0].split()
    except (OSError, IndexError):
        return None
    if not first or first[0] != "cpu":
        return None
    # guest and guest_nice are already counted in user and nice
    ticks = [int(v) for v in first[1:9]]
    total = sum(ticks)
    return total - sum(ticks[i] for i in IDLE_FIELDS), total


def busy_share(before: tuple[int, int] | None, after: tuple[int, int] | None) -> float | None:
    """Share of CPU time busy between two readings (0-1); None without both or with no time between."""
    if before is None or after is None or after[1] <= before[1]:
        return None
    return (after[0] - before[0]) / (after[1] - before[1])
