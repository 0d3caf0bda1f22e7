# Sourced by scripts/demo and scripts/test: make (or reuse) the virtual environment in .venv
# and install fedstream into it, so that each quickstart command works on a fresh machine.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${FEDSTREAM_VENV:-$ROOT/.venv}"
PYTHON="${PYTHON:-python3}"

if ! command -v java >/dev/null 2>&1 && [ -z "${JAVA_HOME:-}" ]; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "[setup] no Java found: installing openjdk-17-jre-headless (Spark 4 needs Java 17 or 21)"
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq openjdk-17-jre-headless
  else
    echo "[setup] Spark 4 needs Java 17 or 21: install it (e.g. apt-get install openjdk-17-jre-headless) and retry" >&2
    exit 3
  fi
fi

# The test suite runs a Node.js client written from docs/protocol.md against a real peer
# (tests/node/); without node that test is skipped, saying so.
if ! command -v node >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "[setup] no node found: installing nodejs (for the protocol client test)"
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nodejs || \
      echo "[setup] nodejs did not install: the Node.js client test will be skipped" >&2
  else
    echo "[setup] node not found: the Node.js protocol client test will be skipped (apt-get install nodejs)" >&2
  fi
fi

# The dashboard's browser test (tests/integration/test_spike.py) drives headless Chromium
# through chromedriver; scripts/test calls this. Without them that part of the test is skipped.
ensure_chromium() {
  if command -v chromium >/dev/null 2>&1 && command -v chromedriver >/dev/null 2>&1; then
    return 0
  fi
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "[setup] no Chromium found: installing chromium and chromium-driver (the dashboard's browser test)"
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium chromium-driver \
      || echo "[setup] Chromium could not be installed: the browser test will be skipped" >&2
  else
    echo "[setup] no Chromium: the browser test will be skipped (apt-get install chromium chromium-driver)" >&2
  fi
}

stamp="$VENV/.fedstream-installed"
if [ ! -x "$VENV/bin/python" ]; then
  echo "[setup] creating virtual environment $VENV"
  "$PYTHON" -m venv "$VENV"
fi
if [ ! -f "$stamp" ] || [ "$ROOT/setup.cfg" -nt "$stamp" ] || [ "$ROOT/pyproject.toml" -nt "$stamp" ]; then
  echo "[setup] installing fedstream and its dependencies (pyspark is large: first time takes a few minutes)"
  "$VENV/bin/python" -m pip install -q --upgrade pip
  "$VENV/bin/python" -m pip install -q -e "$ROOT[test,dev]"
  touch "$stamp"
fi
export PATH="$VENV/bin:$PATH"
export PYSPARK_PYTHON="$VENV/bin/python"
cd "$ROOT"
