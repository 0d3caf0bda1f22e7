"""What the dashboard's charts and the fragment metrics are made of: pure arithmetic.

Theory of operation
-------------------
Every ``SAMPLE_S`` the observer (:mod:`peer.observe.observer`) reads two things and hands
them here.

* Spark's progress reports of each fragment with its own streaming query, the ones newer than
  the last read (:meth:`peer.engine.runner.Engine.progress`). :class:`FragmentFigures` folds
  them in: busy seconds and input tuples add up, the watermark lag and the state store's rows
  and bytes are those of the newest report, and each batch's duration is handed back for the
  histogram. The mark of the newest report read (trigger start, batch id) is kept per
  fragment, as :meth:`~peer.engine.runner.Engine.busy_seconds` keeps its own.
* Cumulative counters (tuples in per stream, result tuples per query and per stream) and the
  latencies seen since the last sample. :func:`point` turns two successive readings into one
  chart point: rates per second over the interval (tuples pushed per stream, result tuples
  per fragment and per stream the fragments write), mean latency, the last batch time,
  backlog. The history of points is a bounded deque: the last minutes, no more.

A counter that went down (a query re-created, a peer restarted) restarts its rate from zero
rather than showing a negative rate.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

SAMPLE_S = 2.0
HISTORY_POINTS = 150  # five minutes of samples


def _time(value: object) -> float | None:
    """Seconds since the epoch of a Spark ISO-8601 time (``2024-05-01T10:00:00.000Z``)."""
    if not isinstance(value, str):
        return None
    try:
        return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def _ms(report: Mapping[str, Any]) -> float | None:
    ms = (report.get("durationMs") or {}).get("triggerExecution")
    if isinstance(ms, bool) or not isinstance(ms, int | float) or ms < 0:
        return None
    return float(ms) / 1000.0


@dataclass
class FragmentFigures:
    """The figures of each fragment, from the progress reports read so far."""

    marks: dict[str, tuple[str, int]] = field(default_factory=dict)
    busy_s: dict[str, float] = field(default_factory=dict)
    input_rows: dict[str, int] = field(default_factory=dict)
    watermark_lag_s: dict[str, float] = field(default_factory=dict)
    state_rows: dict[str, int] = field(default_factory=dict)
    state_bytes: dict[str, int] = field(default_factory=dict)
    busy_ratio: dict[str, float] = field(default_factory=dict)

    def add(
        self, reports: Mapping[str, Iterable[Mapping[str, Any]]], interval_s: float
    ) -> dict[str, list[float]]:
        """Fold in the new reports of each fragment (those newer than its mark; older ones
        are skipped, so giving a report twice counts it once); forget fragments not in
        ``reports``. Returns each fragment's new batch durations (seconds)."""
        for gone in set(self.marks) - set(reports):
            self.forget(gone)
        durations: dict[str, list[float]] = {}
        for name, batch_reports in reports.items():
            mark = self.marks.get(name, ("", -1))
            busy = 0.0
            seen = durations.setdefault(name, [])
            for report in batch_reports:
                stamp, batch = report.get("timestamp"), report.get("batchId")
                if not (isinstance(stamp, str) and isinstance(batch, int)):
                    continue
                if (stamp, batch) <= mark:
                    continue
                mark = (stamp, batch)
                seconds = _ms(report)
                if seconds is not None:
                    busy += seconds
                    seen.append(seconds)
                rows = report.get("numInputRows")
                if isinstance(rows, int) and rows > 0:
                    self.input_rows[name] = self.input_rows.get(name, 0) + rows
                self._newest(name, report)
            self.marks[name] = mark
            self.busy_s[name] = self.busy_s.get(name, 0.0) + busy
            if interval_s > 0:
                self.busy_ratio[name] = min(1.0, busy / interval_s)
        return durations

    def _newest(self, name: str, report: Mapping[str, Any]) -> None:
        event_time = report.get("eventTime") or {}
        watermark, newest = _time(event_time.get("watermark")), _time(event_time.get("max"))
        if watermark is not None and newest is not None and watermark > 0:
            self.watermark_lag_s[name] = max(0.0, newest - watermark)
        operators = report.get("stateOperators")
        if isinstance(operators, list) and operators:
            self.state_rows[name] = sum(int(op.get("numRowsTotal") or 0) for op in operators)
            self.state_bytes[name] = sum(int(op.get("memoryUsedBytes") or 0) for op in operators)

    def forget(self, name: str) -> None:
        for table in (
            self.marks,
            self.busy_s,
            self.input_rows,
            self.watermark_lag_s,
            self.state_rows,
            self.state_bytes,
            self.busy_ratio,
        ):
            table.pop(name, None)

    def by_fragment(self) -> dict[str, dict[str, float]]:
        """Each fragment's figures as one map (the metrics' snapshot)."""
        out: dict[str, dict[str, float]] = {}
        tables: dict[str, Mapping[str, float]] = {
            "busy_s": self.busy_s,
            "busy_ratio": self.busy_ratio,
            "input_rows": self.input_rows,
            "watermark_lag_s": self.watermark_lag_s,
            "state_rows": self.state_rows,
            "state_bytes": self.state_bytes,
        }
        for key, table in tables.items():
            for name, value in table.items():
                out.setdefault(name, {})[key] = value
        return out


@dataclass(frozen=True)
class Reading:
    """Cumulative counters at one instant (unix seconds)."""

    t: float
    records_in: Mapping[str, int]  # per stream, pushed through this peer
    records_out: Mapping[str, int]  # per fragment
    stream_rows: Mapping[str, int] = field(default_factory=dict)  # per stream, made here


def _rates(before: Mapping[str, int], now: Mapping[str, int], dt: float) -> dict[str, float]:
    out = {}
    for name, count in now.items():
        earlier = before.get(name, 0)
        delta = count - earlier if count >= earlier else count
        out[name] = round(delta / dt, 3) if dt > 0 else 0.0
    return out


def point(
    before: Reading | None,
    now: Reading,
    *,
    latencies: Mapping[str, list[float]],
    batch_s: Mapping[str, float],
    backlog: Mapping[str, int],
    utilisation: float | None,
) -> dict[str, Any]:
    """One chart point from two successive readings (the first reading: rates from zero
    over one sample interval)."""
    dt = now.t - before.t if before is not None else SAMPLE_S
    empty: Mapping[str, int] = {}
    return {
        "t": round(now.t, 3),
        "in_rate": _rates(before.records_in if before else empty, now.records_in, dt),
        "out_rate": _rates(before.records_out if before else empty, now.records_out, dt),
        "stream_rate": _rates(before.stream_rows if before else empty, now.stream_rows, dt),
        "records_in": dict(now.records_in),
        "records_out": dict(now.records_out),
        "latency_s": {q: round(sum(v) / len(v), 4) for q, v in latencies.items() if v},
        "batch_s": {q: round(s, 4) for q, s in batch_s.items()},
        "backlog": dict(backlog),
        "util": None if utilisation is None else round(utilisation, 4),
    }
