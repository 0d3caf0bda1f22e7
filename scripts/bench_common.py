"""Helpers shared by the benchmark scripts: process-tree CPU and memory from /proc, machine
facts, quantiles with lost samples, Markdown formatting, and the frame of a run (its results'
header, its work directory, its JSON). Standard library and numpy only
(psutil is not a dependency of fedstream)."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

CLK_TCK = os.sysconf("SC_CLK_TCK")
PAGE_KB = os.sysconf("SC_PAGE_SIZE") // 1024


# --------------------------------------------------------------------------- /proc


def _stat_fields(pid: int) -> list[str] | None:
    try:
        with open(f"/proc/{pid}/stat") as f:
            text = f.read()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    # comm may hold spaces and parentheses: fields start after the last ')'; rest[0] is
    # field 3 (state), so field n (1-based, proc(5)) is rest[n - 3].
    return text[text.rindex(")") + 2 :].split()


def _ppid_map() -> dict[int, list[int]]:
    children: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        fields = _stat_fields(int(name))
        if fields is None:
            continue
        children.setdefault(int(fields[1]), []).append(int(name))
    return children


def process_tree(root: int) -> list[int]:
    """``root`` and all its descendants that are alive now."""
    children = _ppid_map()
    out, todo = [], [root]
    while todo:
        pid = todo.pop()
        if _stat_fields(pid) is None:
            continue
        out.append(pid)
        todo.extend(children.get(pid, []))
    return out


def tree_cpu_seconds(root: int, *, with_children: bool = True) -> float:
    """CPU seconds (user + system, including reaped children) of ``root``'s process tree."""
    pids = process_tree(root) if with_children else [root]
    ticks = 0
    for pid in pids:
        fields = _stat_fields(pid)
        if fields is not None:
            # utime, stime, cutime, cstime = fields 14..17
            ticks += sum(int(fields[n - 3]) for n in (14, 15, 16, 17))
    return ticks / CLK_TCK


def system_busy_seconds() -> float:
    """CPU seconds all cores spent not idle since boot (from /proc/stat)."""
    with open("/proc/stat") as f:
        parts = f.readline().split()[1:]
    user, nice, system, _idle, _iowait, irq, softirq, steal = (int(x) for x in parts[:8])
    return (user + nice + system + irq + softirq + steal) / CLK_TCK


def _cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def _rss_kb(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/statm") as f:
            return int(f.read().split()[1]) * PAGE_KB
    except (OSError, IndexError, ValueError):
        return 0


@dataclass
class TreeMemory:
    rss_mb: float  # sum of RSS over the tree (shared pages counted once per process)
    jvm_rss_mb: float
    processes: int
    python_processes: int

    def as_dict(self) -> dict[str, Any]:
        return {
            "rss_mb": round(self.rss_mb),
            "jvm_rss_mb": round(self.jvm_rss_mb),
            "processes": self.processes,
            "python_processes": self.python_processes,
        }


def tree_memory(root: int) -> TreeMemory:
    total = jvm = 0
    pythons = 0
    pids = process_tree(root)
    for pid in pids:
        rss = _rss_kb(pid)
        total += rss
        cmd = _cmdline(pid)
        first = cmd.split(" ", 1)[0]
        if first.endswith("/java") or first == "java":
            jvm += rss
        elif "python" in os.path.basename(first):
            pythons += 1
    return TreeMemory(total / 1024, jvm / 1024, len(pids), pythons)


def _per_process_cpu(pids: list[int]) -> dict[int, float]:
    out = {}
    for pid in pids:
        fields = _stat_fields(pid)
        if fields is not None:
            out[pid] = sum(int(fields[n - 3]) for n in (14, 15, 16, 17)) / CLK_TCK
    return out


def process_kind(pid: int, root: int) -> str:
    """driver (the root: peer or reference process), jvm, or workers (Spark's Python)."""
    if pid == root:
        return "driver"
    first = _cmdline(pid).split(" ", 1)[0]
    return "jvm" if first.endswith("/java") or first == "java" else "workers"


class CpuMeter:
    """CPU cores used by a process tree (and the whole machine) between start() and stop()."""

    def __init__(self, root: int, *, with_children: bool = True) -> None:
        self.root = root
        self.with_children = with_children
        self._t0 = self._s0 = 0.0
        self._c0: dict[int, float] = {}
        self.breakdown: dict[str, float] = {}

    def _pids(self) -> list[int]:
        return process_tree(self.root) if self.with_children else [self.root]

    def start(self) -> CpuMeter:
        self._t0 = time.monotonic()
        self._c0 = _per_process_cpu(self._pids())
        self._s0 = system_busy_seconds()
        return self

    def stop(self) -> tuple[float, float]:
        """(cores used by the tree, cores busy machine-wide) over the interval; the tree's
        cores by process kind land in ``breakdown``."""
        wall = max(time.monotonic() - self._t0, 1e-9)
        now = _per_process_cpu(self._pids())
        system = system_busy_seconds() - self._s0
        kinds: dict[str, float] = {}
        for pid, cpu in now.items():
            kind = process_kind(pid, self.root)
            kinds[kind] = kinds.get(kind, 0.0) + (cpu - self._c0.get(pid, 0.0)) / wall
        self.breakdown = kinds
        return sum(kinds.values()), system / wall


# --------------------------------------------------------------------------- machine


def _run(cmd: list[str]) -> str:
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return "?"
    return (out.stdout + out.stderr).strip()


def load_average() -> str:
    with open("/proc/loadavg") as f:
        return " ".join(f.read().split()[:3])


def machine_info() -> dict[str, Any]:
    model = "?"
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    with open("/proc/meminfo") as f:
        mem_kb = int(re.search(r"MemTotal:\s+(\d+)", f.read()).group(1))  # type: ignore[union-attr]
    java = _run([shutil.which("java") or "java", "-version"]).splitlines()
    try:
        import pyspark

        spark_version = pyspark.__version__
    except ImportError:
        spark_version = "?"
    import pyarrow

    return {
        "nproc": os.cpu_count(),
        "cpu": model,
        "ram_gib": round(mem_kb / 1024 / 1024, 1),
        "kernel": platform.release(),
        "python": platform.python_version(),
        "java": java[0] if java else "?",
        "pyspark": spark_version,
        "pyarrow": pyarrow.__version__,
        "date": time.strftime("%Y-%m-%d %H:%M %Z"),
    }


def busy_processes(limit: int = 5, exclude: set[int] | None = None) -> list[str]:
    """The most CPU-hungry processes right now (1 s sample), for judging machine noise."""
    exclude = exclude or set()

    def sample() -> dict[int, int]:
        out = {}
        for name in os.listdir("/proc"):
            if name.isdigit() and int(name) not in exclude:
                fields = _stat_fields(int(name))
                if fields is not None:
                    out[int(name)] = int(fields[11]) + int(fields[12])
        return out

    a = sample()
    time.sleep(1.0)
    b = sample()
    used = sorted(((b[p] - a.get(p, b[p])) / CLK_TCK, p) for p in b)[::-1][:limit]
    return [
        f"{cores:.2f} cores pid {pid} {_cmdline(pid)[:80]}" for cores, pid in used if cores > 0.02
    ]


# --------------------------------------------------------------------------- statistics


def quantile(values: np.ndarray, q: float) -> float:
    """The q-quantile as an actual sample (inf stands for a result that never arrived)."""
    if len(values) == 0:
        return float("nan")
    return float(np.quantile(values, q, method="inverted_cdf"))


def fmt_s(value: float | None, *, lost_as: str = "lost") -> str:
    if value is None or value != value:
        return "n/a"
    if value == float("inf"):
        return lost_as
    return f"{value:.2f} s" if value < 10 else f"{value:.1f} s"


def fmt_rate(value: float | None) -> str:
    if value is None or value != value:
        return "n/a"
    if value >= 1e6:
        return f"{value / 1e6:.2f}M"
    if value >= 1e3:
        return f"{value / 1e3:.0f}k"
    return f"{value:.0f}"


def fmt_ratio(num: float | None, den: float | None) -> str:
    if num is None or den is None or num != num or den != den or den == 0:
        return "n/a"
    if num == float("inf") or den == float("inf"):
        return "n/a"
    return f"{num / den:.2f}x"


def md_table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def jsonable(obj: Any) -> Any:
    """``obj`` with NaN as None, infinity as "inf" and paths as text, so that json.dumps writes
    valid JSON."""
    if isinstance(obj, Path):
        return str(obj)
    if isinstance(obj, float):
        return None if obj != obj else ("inf" if obj == float("inf") else obj)
    if isinstance(obj, dict):
        return {str(k): jsonable(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [jsonable(v) for v in obj]
    return obj


# --------------------------------------------------------------------------- runs


def git_commit() -> str:
    root = Path(__file__).resolve().parent.parent
    try:
        head = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=root, capture_output=True, text=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=root,
            capture_output=True,
            text=True,
        ).stdout.strip()
    except OSError:
        return "?"
    return head + (" (work tree modified)" if dirty else "")


def new_results(script: str) -> dict[str, Any]:
    """What a benchmark run reports about itself (``script``: its file), as it starts."""
    machine = machine_info()
    return {
        "command": " ".join([f".venv/bin/python scripts/{script}", *sys.argv[1:]]),
        "commit": git_commit(),
        "date": machine["date"],
        "machine": machine,
        "load_before": load_average(),
        "errors": [],
    }


def header(results: dict[str, Any]) -> list[str]:
    """The command, commit, machine and load lines of a report."""
    m = results["machine"]
    return [
        f"Command: `{results['command']}`, commit {results['commit']}, {results['date']}.",
        f"Machine: {m['nproc']} cores ({m['cpu']}), {m['ram_gib']} GiB, Python {m['python']}; "
        f"load average before {results['load_before']}, after {results['load_after']}; "
        f"{results['elapsed_s']:.0f} s in all.",
        "",
    ]


def run_in(
    args: argparse.Namespace,
    prefix: str,
    main_async: Callable[[argparse.Namespace, Path], Awaitable[dict[str, Any]]],
    report: Callable[[dict[str, Any]], str],
) -> dict[str, Any] | None:
    """Run ``main_async`` in ``--work-dir`` (or a temporary directory, removed after a run
    without errors), write ``--json``, print the report; None if interrupted."""
    work = args.work_dir or Path(tempfile.mkdtemp(prefix=prefix))
    work.mkdir(parents=True, exist_ok=True)
    print(f"work directory {work}", flush=True)
    try:
        results = asyncio.run(main_async(args, work))
    except KeyboardInterrupt:
        print(f"interrupted; logs in {work}", flush=True)
        return None
    if args.json:
        args.json.write_text(json.dumps(jsonable(results), indent=1))
    if not results["errors"] and args.work_dir is None:
        shutil.rmtree(work, ignore_errors=True)
    print("\n" + report(results))
    return results
