# Sourced by deploy/dev/test and deploy/dev/serve: makes a fresh Debian machine ready.
# Installs redis-server with apt-get when it is missing, and the package into ./.venv.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
EXTRAS="${EXTRAS-test}"

if ! command -v redis-server >/dev/null 2>&1; then
  echo "bootstrap: installing redis-server (apt-get)" >&2
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq redis-server >/dev/null
  # Debian starts a service on the default port; this project never uses it.
  ($SUDO systemctl disable --now redis-server >/dev/null 2>&1 || $SUDO service redis-server stop >/dev/null 2>&1 || true)
fi

if [[ ",$EXTRAS," == *",spark,"* ]] && ! command -v java >/dev/null 2>&1; then
  echo "bootstrap: installing a Java runtime for Spark (apt-get)" >&2
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq openjdk-17-jre-headless >/dev/null
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
  if [ -n "$EXTRAS" ]; then
    "$VENV/bin/pip" install -q -e "$ROOT[$EXTRAS]"
  else
    "$VENV/bin/pip" install -q -e "$ROOT"
  fi
  touch "$STAMP"
fi
export PATH="$VENV/bin:$PATH"
cd "$ROOT"
