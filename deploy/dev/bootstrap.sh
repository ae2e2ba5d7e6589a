# Sourced by deploy/dev/test and deploy/dev/serve: makes a fresh Debian machine ready.
# Installs with apt-get what is missing (redis-server; Java for the spark extra; nginx and wrk
# for the test and loadtest extras; chromium and chromium-driver for the test extra), and the
# package into ./.venv.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
EXTRAS="${EXTRAS-test}"

# apt-install keeps Debian's services (default ports) from starting.
if ! command -v redis-server >/dev/null 2>&1; then
  echo "bootstrap: installing redis-server (apt-get)" >&2
  "$ROOT/deploy/dev/apt-install" redis-server:redis-server
fi

if [[ ",$EXTRAS," == *",spark,"* ]] && ! command -v java >/dev/null 2>&1; then
  echo "bootstrap: installing a Java runtime for Spark (apt-get)" >&2
  "$ROOT/deploy/dev/apt-install" openjdk-17-jre-headless
fi

# the load profile (and its short run in the tests) puts nginx in front of the service
if [[ ",$EXTRAS," == *",test,"* || ",$EXTRAS," == *",loadtest,"* ]] \
    && ! command -v nginx >/dev/null 2>&1 && [ ! -x /usr/sbin/nginx ]; then
  echo "bootstrap: installing nginx (apt-get)" >&2
  "$ROOT/deploy/dev/apt-install" nginx-light:nginx
fi

# the CPU benchmark (and its run in the tests) drives the service with wrk: installed here, so
# that the test run itself reaches no network
if [[ ",$EXTRAS," == *",test,"* || ",$EXTRAS," == *",loadtest,"* ]] && ! command -v wrk >/dev/null 2>&1; then
  echo "bootstrap: installing wrk (apt-get)" >&2
  "$ROOT/deploy/dev/apt-install" wrk
fi

# the dashboard's browser tests drive a real headless Chromium through chromedriver
if [[ ",$EXTRAS," == *",test,"* ]] && { [ ! -x /usr/bin/chromium ] || [ ! -x /usr/bin/chromedriver ]; }; then
  echo "bootstrap: installing chromium and chromium-driver (apt-get)" >&2
  "$ROOT/deploy/dev/apt-install" chromium chromium-driver
fi

VENV="$ROOT/.venv"
if [ ! -x "$VENV/bin/python" ]; then
  python3 -m venv "$VENV"
fi
STAMP="$VENV/.installed-$(sha1sum "$ROOT/pyproject.toml" | cut -c1-12)-${EXTRAS//,/_}"
# any earlier install with the test extra also covers the plain one
[ -z "$EXTRAS" ] && ls "$VENV"/.installed-"$(sha1sum "$ROOT/pyproject.toml" | cut -c1-12)"-* >/dev/null 2>&1 \
  && STAMP="$(ls "$VENV"/.installed-"$(sha1sum "$ROOT/pyproject.toml" | cut -c1-12)"-* | head -1)"
if [ ! -f "$STAMP" ]; then
  echo "bootstrap: installing cluster_dq[$EXTRAS] into .venv" >&2
  "$VENV/bin/pip" install -q --upgrade pip >/dev/null
  # (without setuptools' notice that an editable install is one, printed on every install)
  SPEC="$ROOT"; [ -n "$EXTRAS" ] && SPEC="$ROOT[$EXTRAS]"
  PYTHONWARNINGS="ignore:Editable installation" "$VENV/bin/pip" install -q -e "$SPEC"
  touch "$STAMP"
fi
export PATH="$VENV/bin:$PATH"
cd "$ROOT"
