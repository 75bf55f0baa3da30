"""Commands for the task queue: tasks submit, tasks status."""

import json
from typing import Annotated, Any

import typer

from infra.cli.common import Common, command, progress
from infra.settings import Settings

app = typer.Typer(help="the task queue rollout workers take their work from (docs/rollout.md, Tasks)")


def _topics(settings: Settings) -> Any:
    from producers.tasks import TaskTopics

    return TaskTopics.named(
        settings.tasks_topic, dead_letters=settings.task_dlq_topic, outcomes=settings.task_outcomes_topic
    )


def _lock_ms(settings: Settings) -> int:
    """The tasks group's lock as the broker holds it (what leases last), not as settings wish it."""
    from producers.tasks import read_group_terms

    return read_group_terms(
        settings.bootstrap_servers, settings.task_group, extra_config=settings.kafka_client
    ).lock_ms


@command(app, "submit", "submit tasks from a JSONL or Parquet file, a Delta table, or - (JSONL on stdin)")
def submit(
    common: Common,
    source: Annotated[str, typer.Argument(help="a .jsonl/.parquet file, a Delta table path or URI, or -")],
    as_json: Annotated[bool, typer.Option("--json", help="print the report as one JSON object")] = False,
) -> int:
    from producers.tasks import TaskSubmitter, read_rows

    settings = common.settings()
    lock_ms = _lock_ms(settings)
    with TaskSubmitter(
        bootstrap_servers=settings.bootstrap_servers,
        topics=_topics(settings),
        lock_ms=lock_ms,
        default_deadline_ms=min(settings.task_deadline_ms, lock_ms),
        extra_config=settings.kafka_client,
    ) as submitter:
        rows = read_rows(source, storage_options=settings.storage_options)
        report = submitter.submit_rows(rows)
    if as_json:
        print(json.dumps(report.as_dict()))
    else:
        classes = ", ".join(f"{count} {name}" for name, count in report.submitted.items())
        print(f"submitted {report.total} ({classes}); refused {len(report.refused)}")
        for refusal in report.refused:
            print(f"  refused {refusal.where}: {refusal.reason}")
    if report.refused:
        progress(f"{len(report.refused)} row(s) refused; fix them and submit those again")
    return 1 if report.refused else 0


@command(app, "status", "pending, in flight, done and dead tasks per priority, from the outcome log")
def status(
    common: Common,
    as_json: Annotated[bool, typer.Option("--json", help="print the counts as one JSON object")] = False,
) -> int:
    from producers.tasks import read_status

    settings = common.settings()
    result = read_status(
        bootstrap_servers=settings.bootstrap_servers,
        topics=_topics(settings),
        lock_ms=_lock_ms(settings),
        extra_config=settings.kafka_client,
    )
    if as_json:
        print(json.dumps(result.as_dict()))
        return 0
    columns = ("submitted", "pending", "in_flight", "done", "dead", "retries", "requeued")
    print(f"{'priority':<10}" + "".join(f"{name.replace('_', ' '):>11}" for name in columns))
    for name, counts in result.classes.items():
        print(f"{name:<10}" + "".join(f"{getattr(counts, column):>11}" for column in columns))
    if result.unreadable_events:
        progress(f"{result.unreadable_events} outcome event(s) could not be read and were skipped")
    return 0
