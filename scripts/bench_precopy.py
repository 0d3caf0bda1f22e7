#!/usr/bin/env python3
"""The pause of a move under a real overload, before and after the pre-copy (issue 28), in one
run.

``peer demo --spike`` starts three ``peer join`` processes (alpha, beta, gamma), each with its
own Spark, and puts a load spike on alpha; alpha's brain moves fragments to beta under their
contract while the spike goes on. Each move's report says how long the fragment did not run
(its pause), what was sent while it was stopped, and what was sent before, while it still ran
(the pre-copy). This script runs that demo with two versions of the code, taking turns: the
code at ``--before`` (a commit without the pre-copy, unpacked with ``git archive``) and this
work tree. Both use this virtual environment; the unpacked code comes first on PYTHONPATH, in
the demo and in the peers it starts.

    .venv/bin/python scripts/bench_precopy.py --before 60edc24 --runs 3
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_common import header, load_average, md_table, new_results

ROOT = Path(__file__).resolve().parent.parent
RUN_TIMEOUT_S = 600


def unpack(commit: str, where: Path) -> Path:
    """The code of ``commit``, as files (no git metadata)."""
    where.mkdir(parents=True)
    archive = subprocess.run(
        ["git", "archive", commit], cwd=ROOT, capture_output=True, check=True
    ).stdout
    subprocess.run(["tar", "-x", "-C", str(where)], input=archive, check=True)
    return where


def run_demo(code: Path, work: Path, duration: int) -> dict[str, Any]:
    """One ``peer demo --spike`` with the code in ``code``; its moves out of alpha."""
    work.mkdir(parents=True)
    summary = work / "summary.json"
    env = dict(os.environ, PYTHONPATH=str(code), PYTHONUNBUFFERED="1", COLUMNS="200")
    command = [sys.executable, "-m", "peer.cli", "demo", "--spike", "--duration", str(duration)]
    started = time.monotonic()
    with (work / "demo.out").open("wb") as out:
        done = subprocess.run(
            [*command, "--summary", str(summary)],
            cwd=work,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            timeout=RUN_TIMEOUT_S,
            check=False,
        )
    took = time.monotonic() - started
    if not summary.exists():
        return {"ok": False, "exit": done.returncode, "took_s": took, "moves": []}
    found = json.loads(summary.read_text())
    moves = [
        {k: m.get(k) for k in ("fragment", "pause_s", "bytes", "precopy_bytes", "pause_steps")}
        for m in found.get("moves", [])
    ]
    return {
        "ok": all(found["checks"].values()),
        "exit": done.returncode,
        "took_s": took,
        "exact": found.get("exact"),
        "alpha_util_peak": found.get("alpha_util_peak"),
        "moves": moves,
    }


def report(results: dict[str, Any]) -> str:
    lines = header(results)
    rows = []
    for run in results["runs"]:
        first = run["moves"][0] if run["moves"] else {}
        mb = lambda b: "-" if b is None else f"{b / 1e6:.1f}"  # noqa: E731
        rows.append(
            [
                run["code"],
                str(run["run"]),
                f"{run.get('alpha_util_peak') or 0:.2f}",
                str(len(run["moves"])),
                "-" if not first else f"{first['pause_s']:.2f}",
                ", ".join(f"{m['pause_s']:.2f}" for m in run["moves"] if m["pause_s"] is not None),
                mb(first.get("precopy_bytes")),
                mb(first.get("bytes")),
                "yes" if run["ok"] else "NO",
            ]
        )
    lines.append(
        md_table(
            [
                "code",
                "run",
                "alpha peak utilisation",
                "moves",
                "first move: pause (s)",
                "every pause (s)",
                "first move: MB sent before the stop",
                "first move: MB sent during the pause",
                "checks pass",
            ],
            rows,
        )
    )
    lines.append("")
    lines.append("Each pause, step by step (alpha's ledger; the code before has no steps):")
    for run in results["runs"]:
        for move in run["moves"]:
            steps = move.get("pause_steps") or {}
            detail = ", ".join(f"{k.removesuffix('_s')} {v:.2f}" for k, v in steps.items())
            lines.append(
                f"- {run['code']} run {run['run']}, {move['fragment']}: {move['pause_s']:.2f} s "
                f"({detail or '-'})"
            )
    lines.append("")
    for code in ("before", "after"):
        pauses = [m["pause_s"] for r in results["runs"] if r["code"] == code for m in r["moves"]]
        pauses = [p for p in pauses if p is not None]
        if pauses:
            lines.append(
                f"{code}: {len(pauses)} moves, pause median {statistics.median(pauses):.2f} s, "
                f"max {max(pauses):.2f} s"
            )
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--before", required=True, help="the code to compare with (a commit without the pre-copy)"
    )
    parser.add_argument("--runs", type=int, default=3, help="runs of each version (default 3)")
    parser.add_argument("--duration", type=int, default=25, help="the spike's seconds")
    parser.add_argument("--json", type=Path, help="write the results here too")
    args = parser.parse_args()
    results = new_results("bench_precopy.py")
    started = time.monotonic()
    work = Path(tempfile.mkdtemp(prefix="bench-precopy-"))
    print(f"work directory {work}", flush=True)
    before = unpack(args.before, work / "before-code")
    results["before"] = args.before
    results["runs"] = []
    for run in range(args.runs):
        order = [("before", before), ("after", ROOT)]
        if run % 2:
            order.reverse()  # neither version always runs on a machine the other warmed
        for code, path in order:
            print(f"run {run + 1}: {code} ...", flush=True)
            one = run_demo(path, work / f"{code}-{run}", args.duration)
            one.update(code=code, run=run + 1)
            print(json.dumps(one), flush=True)
            results["runs"].append(one)
            if not one["ok"]:
                results["errors"].append(f"{code} run {run + 1}: checks failed (see {work})")
    results["load_after"] = load_average()
    results["elapsed_s"] = time.monotonic() - started
    if args.json:
        args.json.write_text(json.dumps(results, indent=1, default=str))
    print("\n" + report(results))
    return 0 if not results["errors"] else 1


if __name__ == "__main__":
    sys.exit(main())
