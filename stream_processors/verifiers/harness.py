"""The unit-test harness that runs inside the sandbox (its source is copied in as /task/harness.py).

The worker prepares the tests first (`prepare_tests`): it parses /task/tests.py, lists its
top-level ``test*`` functions in /task/tests.names and drops the module's own top-level calls of
them, so the harness imports nothing beyond the interpreter's built-ins (``ast`` and ``json``
cost more CPU than a bare ``python -S`` start). In the sandbox it reads a nonce from stdin,
executes /task/solution.py, then each listed test function (a tests module without any runs
whole, as one test), and prints one line
``<nonce> {"passed": .., "failed": .., "errored": .., "memory_error": .., "first_error_hex": ..}``
(the first error's text as UTF-8 in hex, so no JSON encoder is needed). It isolates the host,
not the reward: code running in the same interpreter can subvert an in-process harness
(docs/sandbox.md).
"""

from __future__ import annotations

import ast

HARNESS_SOURCE = r"""
import sys

def _main():
    nonce = sys.stdin.readline().strip()
    sys.stdin.close()
    counts = {"passed": 0, "failed": 0, "errored": 0, "memory_error": 0}
    first_error = []
    ns = {"__name__": "solution", "__builtins__": __builtins__}

    def note(exc):
        if isinstance(exc, MemoryError):
            counts["memory_error"] = 1
        if not first_error:
            first_error.append(f"{type(exc).__name__}: {exc}"[:300])

    try:
        with open("/task/solution.py") as f:
            exec(compile(f.read(), "solution.py", "exec"), ns)
    except BaseException as exc:
        note(exc)
    with open("/task/tests.names") as f:
        names = f.read().split()
    cases = []
    try:
        with open("/task/tests.py") as f:
            code = compile(f.read(), "tests.py", "exec")
        if names:
            exec(code, ns)
            cases = [ns[n] for n in names]
        else:
            cases = [lambda: exec(code, ns)]
    except BaseException as exc:
        note(exc)
        counts["errored"] = max(1, len(names))
    for case in cases:
        try:
            case()
            counts["passed"] += 1
        except AssertionError as exc:
            counts["failed"] += 1
            note(exc)
        except BaseException as exc:
            counts["errored"] += 1
            note(exc)
    error = (first_error[0] if first_error else "").encode("utf-8", "replace").hex()
    fields = ", ".join(f'"{k}": {int(v)}' for k, v in counts.items())
    sys.stdout.flush()
    sys.stdout.write("\n" + nonce + " {" + fields + ', "first_error_hex": "' + error + '"}\n')
    sys.stdout.flush()

_main()
"""


def prepare_tests(source: str) -> tuple[str, list[str]]:
    """(the tests' source as the harness runs it, its top-level ``test*`` function names).

    The module's own top-level calls of those functions are dropped (the harness calls each
    once). Tests that do not parse here are passed on unchanged with no names: the harness then
    compiles them, and their error is the tests' verdict.
    """
    try:
        tree = ast.parse(source, "tests.py")
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return source, []
    names = [n.name for n in tree.body if isinstance(n, ast.FunctionDef) and n.name.startswith("test")]
    if not names:
        return source, []
    kept = [
        n
        for n in tree.body
        if not (
            isinstance(n, ast.Expr)
            and isinstance(n.value, ast.Call)
            and isinstance(n.value.func, ast.Name)
            and n.value.func.id in names
        )
    ]
    if len(kept) == len(tree.body):
        return source, names
    tree.body = kept
    try:
        return ast.unparse(tree), names
    except (RecursionError, ValueError, MemoryError):
        return source, names
