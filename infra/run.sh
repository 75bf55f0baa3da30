#!/usr/bin/env bash
# One entry for a fresh machine: installs what is missing, then runs a job.
#   bash infra/run.sh demo [demo args...]   the end-to-end demo on a local broker, lake and tracking store
#   bash infra/run.sh test [pytest args...] ruff, mypy, then the test suite against real services
#   bash infra/run.sh install               install every tool the demo and tests need (infra/install.py)
#   bash infra/run.sh env                   only build the environment; prints its path
#   bash infra/run.sh COMMAND [args...]     any other `rollstream` sub-command (status, down, learn, ...)
# The virtual environment lives outside the clone, keyed by a hash of the declared dependencies,
# so every clone on this machine (and CI) reuses it; a changed dependency builds a new one.
# Everything installed lives under ROLLSTREAM_CACHE (default ~/.cache/rollstream), uv's and pip's
# download caches included: an empty directory there is a cold machine.
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cache="$(mkdir -p "${ROLLSTREAM_CACHE:-$HOME/.cache/rollstream}" && cd "${ROLLSTREAM_CACHE:-$HOME/.cache/rollstream}" && pwd)"
export ROLLSTREAM_CACHE="$cache"
export UV_CACHE_DIR="${UV_CACHE_DIR:-$cache/uv}"
export PIP_CACHE_DIR="${PIP_CACHE_DIR:-$cache/pip}"
python="${ROLLSTREAM_PYTHON:-python3}"

dep_hash="$("$python" - "$repo/pyproject.toml" "$repo/uv.lock" <<'PY'
import hashlib, sys, tomllib, platform
project = tomllib.load(open(sys.argv[1], "rb"))["project"]
lock = open(sys.argv[2], "rb").read()
key = repr((platform.python_version_tuple()[:2], project["dependencies"], project.get("optional-dependencies", {})))
print(hashlib.sha256(key.encode() + lock).hexdigest()[:16])
PY
)"
venv="$cache/venv-$dep_hash"
uv_version="0.13.8"

mkdir -p "$cache"
# One build at a time per machine: a second run waits here, then finds the environment ready.
exec 9>"$cache/install.lock"
flock 9
if [ ! -f "$venv/.complete" ]; then
  echo "rollstream: building the virtual environment $venv from uv.lock (torch is a large download; done once per machine)" >&2
  started=$SECONDS
  rm -rf "$venv.partial"
  "$python" -m venv "$venv.partial"
  "$venv.partial/bin/pip" install --quiet --upgrade pip setuptools wheel "uv==$uv_version"
  # Exactly the locked versions of every dependency and extra; the project itself is installed
  # editable below. --inexact keeps pip and setuptools, which that editable install uses.
  (cd "$repo" && UV_PROJECT_ENVIRONMENT="$venv.partial" "$venv.partial/bin/uv" sync --frozen --inexact \
    --all-extras --no-install-project --python "$venv.partial/bin/python" --no-progress)
  rm -rf "$venv"
  mv "$venv.partial" "$venv"
  # A venv's scripts carry its absolute path: rewrite them after the move.
  grep -rlI "$venv.partial" "$venv/bin" | xargs -r sed -i "s#$venv.partial#$venv#g"
  touch "$venv/.complete"
  echo "rollstream: environment ready in $((SECONDS - started)) s" >&2
  # Each environment is several GB: keep the three newest (clones on other commits may use them).
  ls -1dt "$cache"/venv-* 2>/dev/null | grep -v '\.partial$' | tail -n +4 | xargs -r rm -rf
else
  echo "rollstream: environment $venv ready (built before)" >&2
fi
# Bytecode for every installed module, once per environment: uv writes none, and with
# PYTHONDONTWRITEBYTECODE set (as on CI machines) each process would otherwise compile torch,
# sympy, mlflow and the rest from source on every start (sympy alone 5 s of CPU against 1 s).
if [ ! -f "$venv/.compiled" ]; then
  started=$SECONDS
  "$venv/bin/python" -m compileall -q -j 0 "$venv/lib" > "$venv/compileall.log" 2>&1 || true
  touch "$venv/.compiled"
  echo "rollstream: bytecode compiled in $((SECONDS - started)) s" >&2
fi
if ! "$venv/bin/pip" install --quiet --no-deps --no-build-isolation -e "$repo" > "$venv/editable-install.log" 2>&1; then
  cat "$venv/editable-install.log" >&2
  exit 1
fi
flock -u 9
export PATH="$venv/bin:$PATH"
# Every clone on the machine shares the environment, so this clone's code must win over whichever
# clone last did the editable install (child processes inherit it too).
export PYTHONPATH="$repo${PYTHONPATH:+:$PYTHONPATH}"

job="${1:-}"; shift || true
case "$job" in
  env) echo "$venv" ;;
  install) exec python -m infra.install "$@" ;;
  test) python -m infra.install && exec bash "$repo/infra/test.sh" "$@" ;;
  "") echo "usage: bash infra/run.sh {demo|test|install|env|COMMAND} [args...]  (COMMAND: any rollstream sub-command, e.g. status, down)" >&2; exit 2 ;;
  *) exec rollstream "$job" "$@" ;;
esac
