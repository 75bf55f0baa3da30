"""The unit-test harness that runs inside the sandbox (its source is copied in as /task/harness.py).

It reads a nonce from stdin, executes /task/solution.py, then each ``test*`` function that
/task/tests.py defines (a tests module without any runs whole, as one test), and prints one line
``<nonce> {"passed": .., "failed": .., "errored": ..}``. It isolates the host, not the reward:
code running in the same interpreter can subvert an in-process harness (docs/sandbox.md).
"""

HARNESS_SOURCE = r"""
import ast, json, sys

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
    with open("/task/tests.py") as f:
        tree = ast.parse(f.read(), "tests.py")
    names = [n.name for n in tree.body if isinstance(n, ast.FunctionDef) and n.name.startswith("test")]
    if names:
        tree.body = [
            n for n in tree.body
            if not (isinstance(n, ast.Expr) and isinstance(n.value, ast.Call)
                    and isinstance(n.value.func, ast.Name) and n.value.func.id in names)
        ]
    cases = []
    try:
        code = compile(tree, "tests.py", "exec")
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
    counts["first_error"] = first_error[0] if first_error else ""
    sys.stdout.flush()
    sys.stdout.write("\n" + nonce + " " + json.dumps(counts) + "\n")
    sys.stdout.flush()

_main()
"""
