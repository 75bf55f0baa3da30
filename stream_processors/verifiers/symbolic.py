"""Symbolic equivalence with sympy, bounded in time and memory: a helper process per checker.

sympy can take unbounded time on hostile input (``9^9^9^9``), so checks run in a long-lived
helper process with an address-space limit, and a check that exceeds its time is answered
"timeout" and the helper is killed (a new one starts on the next check). Input reaches sympy's
parser only after a whitelist (digits, operators, parentheses and a few known names), so the
parser's ``eval`` never sees attribute access, strings or dunders.
"""

from __future__ import annotations

import json
import re
import select
import subprocess
import sys
import threading
from typing import Literal

SymbolicResult = Literal["equal", "different", "unparsable", "timeout"]
NAMES = frozenset({"sqrt", "pi", "e", "i", "I", "oo", "log", "ln", "sin", "cos", "tan", "exp",
                   "x", "y", "z", "n", "k", "a", "b", "c", "t"})  # fmt: skip
_WARM_UP_S = 30.0
_ALLOWED = re.compile(r"^[0-9A-Za-z+\-*/^(). ]{1,200}$")
_IDENT = re.compile(r"[A-Za-z]+")

_SERVER = r"""
import json, resource, sys
resource.setrlimit(resource.RLIMIT_AS, (MEMORY, MEMORY))
from sympy import N, simplify, Symbol, E, I, pi, oo, sqrt, log, sin, cos, tan, exp
from sympy.parsing.sympy_parser import (convert_xor, implicit_multiplication_application,
                                        parse_expr, standard_transformations)
T = standard_transformations + (implicit_multiplication_application, convert_xor)
LOCAL = {"e": E, "i": I, "I": I, "pi": pi, "oo": oo, "sqrt": sqrt, "log": log, "ln": log, "sin": sin,
         "cos": cos, "tan": tan, "exp": exp}
for name in "xyznkabct":
    LOCAL[name] = Symbol(name)
for line in sys.stdin:
    a, b, tol = json.loads(line)
    try:
        ea = parse_expr(a, local_dict=dict(LOCAL), transformations=T)
        eb = parse_expr(b, local_dict=dict(LOCAL), transformations=T)
        if simplify(ea - eb) == 0:
            result = "equal"
        else:
            try:
                va, vb = complex(N(ea)), complex(N(eb))
                result = "equal" if abs(va - vb) <= tol * max(1.0, abs(vb)) else "different"
            except (TypeError, ValueError):
                result = "different"
    except Exception:
        result = "unparsable"
    sys.stdout.write(json.dumps(result) + "\n")
    sys.stdout.flush()
"""


def admissible(expression: str) -> bool:
    """Whether an expression may reach sympy's parser: whitelisted characters and names only."""
    return bool(_ALLOWED.match(expression)) and all(w in NAMES for w in _IDENT.findall(expression))


class SymbolicChecker:
    """Answers whether two expressions are equal, each check bounded by `timeout_s`; thread-safe.

    Args:
        timeout_s: the longest one check may take; then "timeout" and the helper is replaced.
        memory_bytes: the helper's address-space limit.
    """

    def __init__(self, timeout_s: float = 2.0, memory_bytes: int = 1 << 30) -> None:
        self.timeout_s = timeout_s
        self.memory_bytes = memory_bytes
        self._lock = threading.Lock()
        self._proc: subprocess.Popen[str] | None = None

    def _helper(self) -> subprocess.Popen[str]:
        """The running helper; a new one is started and warmed up (sympy imported) first."""
        if self._proc is None or self._proc.poll() is not None:
            self._proc = subprocess.Popen(
                [sys.executable, "-c", _SERVER.replace("MEMORY", str(self.memory_bytes))],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL,
                text=True,
            )
            if self._ask(self._proc, "1", "1", 0.0, _WARM_UP_S) != "equal":
                self.close()
                raise RuntimeError("the sympy helper did not start; is sympy installed?")
        return self._proc

    @staticmethod
    def _ask(proc: subprocess.Popen[str], a: str, b: str, tolerance: float, limit: float) -> str | None:
        assert proc.stdin is not None and proc.stdout is not None
        try:
            proc.stdin.write(json.dumps([a, b, tolerance]) + "\n")
            proc.stdin.flush()
            ready, _, _ = select.select([proc.stdout], [], [], limit)
            line = proc.stdout.readline() if ready else ""
        except OSError:
            return None
        return json.loads(line) if line else None

    def equal(self, a: str, b: str, tolerance: float = 1e-9) -> SymbolicResult:
        """ "equal", "different", "unparsable" (or not admissible), or "timeout"."""
        if not (admissible(a) and admissible(b)):
            return "unparsable"
        with self._lock:
            result = self._ask(self._helper(), a, b, tolerance, self.timeout_s)
            if result is None:
                self.close()
                return "timeout"
            return result  # type: ignore[return-value]

    def close(self) -> None:
        """Kill the helper (a new one starts on the next check)."""
        if self._proc is not None:
            self._proc.kill()
            self._proc.wait()
            for stream in (self._proc.stdin, self._proc.stdout):
                if stream is not None:
                    stream.close()
            self._proc = None
