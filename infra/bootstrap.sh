#!/usr/bin/env bash
# Creates (or reuses) the project's virtualenv and runs one of: demo, test, bench, lint, proto, lock, jars.
#
# The venv lives in .venv (override with BKAUDIT_VENV) and is rebuilt only when pyproject.toml changes:
# its hash is stamped into the venv after a successful install. pip's wheel cache keeps the pyspark build
# (a ~456 MB sdist) from being repeated on the same machine.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$here"
action="${1:-test}"
shift || true

venv="${BKAUDIT_VENV:-$here/.venv}"
python_bin="${BKAUDIT_PYTHON:-}"
if [[ -z "$python_bin" ]]; then
  for candidate in python3.11 python3.12 python3; do
    if command -v "$candidate" >/dev/null 2>&1 && "$candidate" -c 'import sys; sys.exit(0 if (3, 11) <= sys.version_info[:2] < (3, 13) else 1)'; then
      python_bin="$candidate"; break
    fi
  done
fi
if [[ -z "$python_bin" ]]; then
  echo "bootstrap: need Python 3.11 or 3.12 on PATH (set BKAUDIT_PYTHON to choose one)" >&2
  exit 2
fi

# System packages come from Debian when we run as root with apt-get (CI, a fresh container); `apt-get update`
# runs at most once per bootstrap, whatever is missing.
apt_updated=""
can_apt() { [[ "$(id -u)" == 0 ]] && command -v apt-get >/dev/null 2>&1; }
apt_install() {
  if [[ -z "$apt_updated" ]]; then
    apt-get update -qq || return  # explicit: callers may run this where set -e does not apply
    apt_updated=1
  fi
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@" >/dev/null
}

# The rule tests (tests/unit/test_observability_assets.py) run promtool, which ships in Debian's prometheus
# package. Its postinst starts the Prometheus daemon unless /usr/sbin/policy-rc.d says no (exit 101; Docker
# images ship one, other machines may not), so a refusing policy is put in place for the install, and on a
# systemd host the unit the package enables is disabled again: we want the tool, not a server.
ensure_promtool() {
  command -v promtool >/dev/null 2>&1 && return 0
  if ! can_apt; then
    echo "bootstrap: promtool is not on PATH and cannot be installed here (not root or no apt-get); the" \
      "promtool tests will fail: install Debian's prometheus package or put promtool on PATH" >&2
    return 0
  fi
  echo "bootstrap: installing promtool (Debian's prometheus package; the service is not started)" >&2
  local policy=/usr/sbin/policy-rc.d own_policy=""
  if [[ ! -e "$policy" ]]; then
    own_policy=1
    trap 'rm -f /usr/sbin/policy-rc.d' EXIT  # never leave it behind: it would stop every service start
    printf '#!/bin/sh\nexit 101\n' >"$policy"
    chmod 755 "$policy"
  fi
  local status=0
  apt_install --no-install-recommends prometheus || status=$?
  if [[ -n "$own_policy" ]]; then
    rm -f "$policy"
    trap - EXIT
  fi
  if [[ -d /run/systemd/system ]]; then
    systemctl disable prometheus.service >/dev/null 2>&1 || true
  fi
  return "$status"
}

# ZooKeeper (from pyspark's jars) and Spark need a JVM. Install one from Debian when we can.
if ! command -v java >/dev/null 2>&1; then
  if can_apt; then
    echo "bootstrap: installing a Java runtime (openjdk-17-jre-headless)" >&2
    apt_install openjdk-17-jre-headless
  else
    echo "bootstrap: Java 17+ is required (ZooKeeper and Spark run on the JVM); install it and retry" >&2
    exit 2
  fi
fi

# The tested dependency set: every install takes its versions from constraints.txt (refreshed by `make lock`).
constraints="$here/constraints.txt"
stamp_file="$venv/.bkaudit-stamp"
want_stamp="$( (cat pyproject.toml "$constraints"; "$python_bin" -c 'import sys; print(sys.version)') | sha256sum | cut -c1-16)"
if [[ ! -x "$venv/bin/python" ]] || [[ "$(cat "$stamp_file" 2>/dev/null)" != "$want_stamp" ]]; then
  started=$(date +%s)
  echo "bootstrap: installing into $venv (first run on a machine takes a few minutes: pyspark is large)" >&2
  [[ -x "$venv/bin/python" ]] || "$python_bin" -m venv "$venv"
  "$venv/bin/python" -m pip install -q --upgrade pip >/dev/null
  "$venv/bin/python" -m pip install -q -c "$constraints" -e ".[dev]"
  echo "$want_stamp" > "$stamp_file"
  echo "bootstrap: install took $(( $(date +%s) - started )) s" >&2
fi
export PATH="$venv/bin:$PATH"

# The JVM components (real BookKeeper, the Kafka broker, Spark's Delta and Kafka connectors) come as jars that
# Maven copies from the POMs under infra/jars into .jars/ (reused while each POM is unchanged). Maven comes
# from Debian when missing. A coordinate the registry refuses stops here with one line that names it.
ensure_jars() {
  if ! command -v mvn >/dev/null 2>&1; then
    if can_apt; then
      echo "bootstrap: installing Maven (Debian's maven package)" >&2
      apt_install --no-install-recommends maven
    else
      echo "bootstrap: Maven (mvn) is required to copy the JVM components' jars; install it and retry" >&2
      exit 2
    fi
  fi
  python -m connectors.jars "$@" >/dev/null || exit 2
}
export PYSPARK_PYTHON="$venv/bin/python"
export PYSPARK_DRIVER_PYTHON="$venv/bin/python"

case "$action" in
  demo)
    ensure_jars
    exec bkaudit demo "$@"
    ;;
  test)
    ensure_promtool
    ensure_jars
    # Exit code 5 (no tests collected) is a failure for us: a suite that ran nothing proves nothing.
    # Three workers (BKAUDIT_TEST_WORKERS), each with its own services and Spark session; a worker runs a
    # module whole (tests/conftest.py groups them), so module fixtures and file order hold. Three on two
    # cores: much of a test is waiting (sessions to expire, re-probe delays), which a third worker fills.
    exec python -m pytest -n "${BKAUDIT_TEST_WORKERS:-3}" "$@"
    ;;
  bench)
    ensure_jars
    exec python -m pytest tests/benchmarks -m benchmark -s -p no:cacheprovider -o addopts="" "$@"
    ;;
  lint)
    ruff check . && ruff format --check . && mypy core connectors streaming bkaudit
    ;;
  lock)
    # Resolve pyproject.toml afresh (no constraints) in a scratch venv and pin what it installed.
    scratch="$(mktemp -d)"
    trap 'rm -rf "$scratch"' EXIT
    "$python_bin" -m venv "$scratch/venv"
    "$scratch/venv/bin/python" -m pip install -q --upgrade pip >/dev/null
    "$scratch/venv/bin/python" -m pip install -q -e ".[dev]"
    {
      sed -n '/^#/p' "$constraints"
      "$scratch/venv/bin/python" -m pip freeze --all --exclude-editable | grep -v '^-e \|^#\|^pip=='
    } > "$constraints.new"
    mv "$constraints.new" "$constraints"
    echo "lock: rewrote constraints.txt ($(grep -vc '^#' "$constraints") pins); review 'git diff constraints.txt', then make test" >&2
    ;;
  jars)
    ensure_jars "$@"
    echo "jars: $(ls -d "${BKAUDIT_JARS_DIR:-$here/.jars}"/*/ | tr '\n' ' ')"
    ;;
  proto)
    python -m grpc_tools.protoc -Iproto --python_out=core/pb --pyi_out=core/pb proto/*.proto
    # protoc writes absolute-package imports between generated files; ours are self-contained, so nothing to fix.
    echo "generated: $(ls core/pb/*_pb2.py | tr '\n' ' ')"
    ;;
  *)
    echo "bootstrap: unknown action '$action' (demo, test, bench, lint, proto, lock, jars)" >&2
    exit 2
    ;;
esac
