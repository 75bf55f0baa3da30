"""What the compiled Avro reader and writer share: the source of one generated function."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


class UnsupportedSchema(Exception):
    """The schema has a type the compiled reader or writer does not cover."""


class Source:
    """A generated function's lines, its constants and its fresh variable names."""

    def __init__(self) -> None:
        self.lines: list[str] = []
        self.names: dict[str, Any] = {}
        self._count = 0

    def fresh(self, stem: str) -> str:
        self._count += 1
        return f"{stem}{self._count}"

    def constant(self, value: Any) -> str:
        name = self.fresh("K")
        self.names[name] = value
        return name

    def line(self, indent: int, text: str) -> None:
        self.lines.append(" " * indent + text)

    def function(self, name: str, label: str, globals_: Mapping[str, Any]) -> Any:
        """Compile the lines (labelled `label` in tracebacks) with the constants and `globals_`,
        and return the function they define as `name`."""
        namespace: dict[str, Any] = {**self.names, **globals_}
        exec(compile("\n".join(self.lines), label, "exec"), namespace)
        return namespace[name]
