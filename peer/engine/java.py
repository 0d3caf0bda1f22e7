"""Finding a Java that Spark 4 can run on, and saying how to get one when there is none.

Kept free of pyspark imports so that ``peer doctor`` and every command that needs Spark can
check first and fail with an actionable message instead of a py4j stack trace.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from peer.errors import JavaMissing

SUPPORTED_MAJORS = (17, 21)

HOW_TO_FIX = (
    "Spark 4 needs Java 17 or 21. Install one from your operating system, e.g. "
    "`sudo apt-get install openjdk-17-jre-headless` (Debian/Ubuntu), "
    "`sudo dnf install java-17-openjdk-headless` (Fedora/RHEL) or "
    "`brew install openjdk@17` (macOS), then set JAVA_HOME to it or put its `java` on PATH. "
    "`peer join --no-engine` runs a peer without Spark."
)


@dataclass(frozen=True)
class JavaInfo:
    executable: str
    major: int
    version: str


def _java_executable() -> str | None:
    home = os.environ.get("JAVA_HOME")
    if home:
        candidate = Path(home) / "bin" / "java"
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return str(candidate)
    return shutil.which("java")


def parse_java_version(output: str) -> tuple[int, str] | None:
    """Parse the first line of ``java -version`` (``openjdk version "17.0.15" ...``)."""
    match = re.search(r'version "([^"]+)"', output)
    if not match:
        return None
    version = match.group(1)
    parts = version.split(".")
    try:
        major = int(parts[1]) if parts[0] == "1" else int(parts[0].split("-")[0])
    except (ValueError, IndexError):
        return None
    return major, version


def find_java(timeout_s: float = 20.0) -> JavaInfo:
    """Return the Java Spark would use, or raise JavaMissing saying how to fix it."""
    exe = _java_executable()
    if exe is None:
        raise JavaMissing(f"no Java found (JAVA_HOME unset and no `java` on PATH). {HOW_TO_FIX}")
    try:
        proc = subprocess.run(
            [exe, "-version"], capture_output=True, text=True, timeout=timeout_s, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise JavaMissing(f"`{exe} -version` failed: {exc}. {HOW_TO_FIX}") from exc
    parsed = parse_java_version(proc.stderr + proc.stdout)
    if parsed is None:
        raise JavaMissing(f"cannot read the version of {exe}. {HOW_TO_FIX}")
    major, version = parsed
    if major not in SUPPORTED_MAJORS:
        raise JavaMissing(f"{exe} is Java {version}, not 17 or 21. {HOW_TO_FIX}")
    return JavaInfo(exe, major, version)
