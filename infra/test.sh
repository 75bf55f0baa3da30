#!/usr/bin/env bash
# The test job: lint, type-check, start a real broker for the suite, run pytest, stop the broker.
# Called by `bash infra/run.sh test` (which installs everything first); .ci/run calls that.
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo"

if ! command -v chromium >/dev/null 2>&1; then
  # The report's rendering test opens it in headless Chromium (Debian's package).
  echo "== installing chromium (once per machine)"
  if [ "$(id -u)" = 0 ]; then
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null
  else
    echo "chromium is missing: install Debian's chromium package (apt-get install chromium)" >&2
    exit 1
  fi
fi

echo "== ruff"
ruff check .
ruff format --check .
echo "== mypy"
mypy

# The suite gets its own broker on its own ports, so a developer's `rollstream up` is untouched.
state="$(mktemp -d "${TMPDIR:-/tmp}/rollstream-test.XXXXXX")"
export ROLLSTREAM_STATE_DIR="$state"
export ROLLSTREAM_KAFKA_PORT="${ROLLSTREAM_TEST_KAFKA_PORT:-39092}"
export ROLLSTREAM_CONTROLLER_PORT="${ROLLSTREAM_TEST_CONTROLLER_PORT:-39093}"
export ROLLSTREAM_BOOTSTRAP_SERVERS="127.0.0.1:$ROLLSTREAM_KAFKA_PORT"
cleanup() {
  rollstream down || true
  rm -rf "$state"
}
trap cleanup EXIT
echo "== rollstream up (state in $state)"
rollstream up
echo "== pytest"
pytest "$@"
