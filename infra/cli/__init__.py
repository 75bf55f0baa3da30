"""The `rollstream` command line (typer): one sub-command per job, each a thin shell over the library.

This package is the edge of the system: it folds the config file, environment and flags into one
`Settings` object (common.py) and passes plain keyword arguments down to the rooms. Commands live
by concern: stack.py (up, down, status, domains, profile, offsets), pipeline.py (produce, process,
rescore, learn, demo), lake.py (sql, maintain, report), serve.py (serve), rollout.py (rollout), tasks.py
(tasks submit, status).
"""

import sys
import warnings
from collections.abc import Sequence
from typing import Any

import typer

from infra.cli import common, lake, pipeline, rollout, serve, stack, tasks
from infra.cli.common import UsageError, root
from infra.exceptions import SettingsWarning
from schemas.exceptions import RollstreamError

__all__ = ["UsageError", "main"]

for _group in (stack, pipeline, lake, serve, rollout):  # in this order in `rollstream --help`
    root.registered_commands.extend(_group.app.registered_commands)
root.add_typer(stack.profile_app, name="profile")
root.add_typer(stack.offsets_app, name="offsets")
root.add_typer(tasks.app, name="tasks")
_COMMANDS = {info.name for info in root.registered_commands} | {"profile", "offsets", "tasks"}


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the `rollstream` console script; returns the exit code.

    0 done, 1 the job ran but failed its own check (produce, demo), 2 a usage, settings, Kafka or
    other rollstream error (one line on stderr), 3 `status` found the broker down, 130 Ctrl-C.
    """
    args = list(sys.argv[1:] if argv is None else argv)
    common.INVOCATION[:] = args
    name = next((a for a in args if not a.startswith("-")), "")
    name = name if name in _COMMANDS else ""
    warnings.showwarning = _show_warning
    try:
        result = typer.main.get_command(root).main(args=args, prog_name="rollstream", standalone_mode=False)
    except RollstreamError as exc:
        print(f"rollstream {name}: error: {exc}".replace("rollstream : ", "rollstream: "), file=sys.stderr)
        return 2
    except typer.Abort:
        return 130
    except KeyboardInterrupt:
        return 130
    except typer.TyperException as exc:  # click's usage errors: a bad flag or value
        message = str(exc.format_message() if hasattr(exc, "format_message") else exc).rstrip(".")
        if message:  # empty when the help was shown instead (no command given)
            where = f"rollstream {name}" if name else "rollstream"
            print(f"{where}: error: {message}; see `{where} --help`", file=sys.stderr)
        return int(getattr(exc, "exit_code", 2))
    except Exception as exc:
        if not _is_kafka_error(exc):
            raise
        print(
            f"rollstream {name}: error: Kafka: {exc.args[0].str() if exc.args else exc}; "
            "is the broker up? `rollstream status` tells, `rollstream up` starts it",
            file=sys.stderr,
        )
        return 2
    return result if isinstance(result, int) else 0


def _is_kafka_error(exc: Exception) -> bool:
    """True for a confluent-kafka error; the module is only looked at when a command loaded it."""
    kafka = sys.modules.get("confluent_kafka")
    return kafka is not None and isinstance(exc, kafka.KafkaException)


_show_other = warnings.showwarning


def _show_warning(message: Any, category: type[Warning], *args: Any, **kwargs: Any) -> None:
    """A settings warning as one line on stderr; others as Python shows them."""
    if issubclass(category, SettingsWarning):
        print(f"rollstream: warning: {message}", file=sys.stderr)
    else:
        _show_other(message, category, *args, **kwargs)


if __name__ == "__main__":
    sys.exit(main())
