"""Resource limits of one sandboxed execution, applied as rlimits before bwrap starts."""

from __future__ import annotations

from dataclasses import asdict, dataclass

MIB = 1024 * 1024


@dataclass(frozen=True, slots=True)
class Limits:
    """What one execution may use. Every field is enforced, none is advisory.

    Attributes:
        cpu_s: CPU seconds (RLIMIT_CPU, per process; SIGXCPU, then SIGKILL one second later).
        wall_s: wall-clock seconds before the whole process tree is killed.
        memory_bytes: address space per process (RLIMIT_AS).
        processes: most processes at once (a pids cgroup per execution; RLIMIT_NPROC, left as
            the worker's, counts all processes of one host uid: it never binds root, and binds
            a root worker's sandbox id across all its executions at once).
        open_files: file descriptors per process (RLIMIT_NOFILE).
        file_bytes: largest file a process may write (RLIMIT_FSIZE).
        tmpfs_bytes: size of each private writable tmpfs (/work and /tmp).
        output_bytes: most bytes stdout and stderr may each carry: past it the tree is killed
            ("output_limit") and no more is read.
    """

    cpu_s: int = 10
    wall_s: float = 20.0
    memory_bytes: int = 512 * MIB
    processes: int = 32
    open_files: int = 64
    file_bytes: int = 16 * MIB
    tmpfs_bytes: int = 64 * MIB
    output_bytes: int = 64 * 1024

    def __post_init__(self) -> None:
        for name, value in asdict(self).items():
            if value <= 0:
                raise ValueError(f"Limits.{name} must be positive, got {value!r}")

    def as_dict(self) -> dict[str, float]:
        """The limits as a flat mapping (the audit table's `limits` column)."""
        return {k: float(v) for k, v in asdict(self).items()}

    def replace(self, **changes: float) -> Limits:
        """A copy with some limits changed (a domain's options override the defaults)."""
        values: dict[str, float] = {**asdict(self), **changes}
        unknown = set(changes) - set(asdict(self))
        if unknown:
            raise ValueError(f"unknown sandbox limit(s) {sorted(unknown)}; known: {sorted(asdict(self))}")
        return Limits(
            **{k: (float(v) if k == "wall_s" else int(v)) for k, v in values.items()}  # type: ignore[arg-type]
        )
