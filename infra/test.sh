#!/usr/bin/env bash
# The test job: lint, type-check, start a real broker for the suite, run pytest, stop the broker.
# Called by `bash infra/run.sh test`, which runs the install step (infra/install.py) first; .ci/run calls that.
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo"

echo "== ruff"
ruff check .
ruff format --check .
echo "== mypy"
mypy

# The suite gets its own broker on its own ports, so a developer's `rollstream up` is untouched.
state="$(mktemp -d "${TMPDIR:-/tmp}/rollstream-test.XXXXXX")"
export ROLLSTREAM_STATE_DIR="$state"
export ROLLSTREAM_KAFKA__PORT="${ROLLSTREAM_TEST_KAFKA_PORT:-39092}"
export ROLLSTREAM_KAFKA__CONTROLLER_PORT="${ROLLSTREAM_TEST_CONTROLLER_PORT:-39093}"
export ROLLSTREAM_KAFKA__BOOTSTRAP_SERVERS="127.0.0.1:$ROLLSTREAM_KAFKA__PORT"
cleanup() {
  rollstream down || true
  rm -rf "$state"
}
trap cleanup EXIT
echo "== rollstream up (state in $state)"
rollstream up
# Two pytest-xdist workers by default (ROLLSTREAM_TEST_WORKERS; 0 runs in this process), each
# taking a whole file at a time, so a file's module fixtures start once; tests/conftest.py puts the
# slowest files first and --no-loadscope-reorder keeps that order (xdist would sort files by their
# number of tests). Most tests wait on brokers and subprocesses, so two share 2 cores well. The
# tests run at a lower priority than the suite's broker, which every test needs answering.
workers="${ROLLSTREAM_TEST_WORKERS:-2}"
echo "== pytest ($workers workers)"
nice -n 5 pytest -n "$workers" --dist loadscope --no-loadscope-reorder "$@"
