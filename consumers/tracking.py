"""MLflow runs for learners: params, per-step metrics, and the table version they trained on.

The tracking URI is always explicit (HAZARDS.md: mlflow's default is `./mlflow.db` in whatever
directory the process started in). Lineage is recorded at the end of a run, when the version range read
is known: tags `rollstream.table_uri`, `rollstream.table_version` (the last version read) and
`rollstream.table_versions` ("first-last"), and a dataset input named `<table>@v<first>-v<last>`
(`MetaDataset` over a `DeltaDatasetSource`, no Spark needed). mlflow 3.17.2's
`DeltaDatasetSource.to_dict` drops version 0 (it tests the version for truthiness), so the
dataset's name and input tags carry the version too. A new experiment's artifacts go beside a
sqlite store (`<db dir>/mlartifacts`), not mlflow's default `./mlruns` under whatever directory
the process started in. System metrics stay off: they need
psutil, which mlflow does not install. mlflow is imported on first use, so importing
`consumers` (e.g. in DataLoader workers) stays fast.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from consumers.exceptions import TrackingError
from consumers.table import TableSnapshot

if TYPE_CHECKING:
    from mlflow.data.meta_dataset import MetaDataset

TABLE_URI_TAG = "rollstream.table_uri"
TABLE_VERSION_TAG = "rollstream.table_version"
TABLE_VERSIONS_TAG = "rollstream.table_versions"


@dataclass(frozen=True)
class TrackedRun:
    """An active MLflow run that a learner logs into."""

    run_id: str
    experiment_id: str

    def log_step(self, step: int, metrics: Mapping[str, float]) -> None:
        """Log one step's metrics in a single batch call."""
        import mlflow

        mlflow.log_metrics(dict(metrics), step=step, run_id=self.run_id)

    def log_summary(self, metrics: Mapping[str, float]) -> None:
        """Log end-of-run metrics (no step)."""
        import mlflow

        mlflow.log_metrics(dict(metrics), run_id=self.run_id)

    def log_lineage(
        self, table_uri: str, first_version: int, last_version: int, context: str = "training"
    ) -> None:
        """Record the table and the version range read: tags, and a dataset input named by the range."""
        import mlflow

        tags = {
            TABLE_URI_TAG: table_uri,
            TABLE_VERSION_TAG: str(last_version),
            TABLE_VERSIONS_TAG: f"{first_version}-{last_version}",
        }
        mlflow.set_tags(tags)
        snapshot = TableSnapshot(uri=table_uri, version=last_version)
        mlflow.log_input(table_dataset(snapshot, first_version), context=context, tags=tags)

    def log_text(self, text: str, artifact_file: str) -> None:
        """Store a small text file (e.g. the workload profile) as an artifact of the run."""
        import mlflow

        mlflow.log_text(text, artifact_file, run_id=self.run_id)


@contextmanager
def track_run(
    *,
    tracking_uri: str,
    experiment: str,
    table_uri: str,
    params: Mapping[str, object],
    run_id: str | None = None,
    artifact_location: str | None = None,
) -> Iterator[TrackedRun]:
    """Start (or, with `run_id`, resume) an MLflow run with params; end it (FAILED on an exception).

    The table's lineage (the version range actually read) is logged at the end by
    `TrackedRun.log_lineage`, when the range is known. `artifact_location` applies only when the
    experiment is created here; None puts a sqlite store's artifacts beside its file.

    Raises:
        TrackingError: `tracking_uri` is empty or has no scheme.
    """
    import mlflow

    check_tracking_uri(tracking_uri)
    mlflow.set_tracking_uri(tracking_uri)
    found = mlflow.set_experiment(
        experiment_id=_experiment_id(experiment, artifact_location or _artifacts_beside(tracking_uri))
    )
    tags = {TABLE_URI_TAG: table_uri}
    with mlflow.start_run(
        run_id=run_id, experiment_id=found.experiment_id, tags=tags, log_system_metrics=False
    ) as run:
        if run_id is None:
            mlflow.log_params({**params, "table_uri": table_uri})
        yield TrackedRun(run_id=run.info.run_id, experiment_id=found.experiment_id)


def table_dataset(snapshot: TableSnapshot, first_version: int | None = None) -> MetaDataset:
    """An MLflow dataset naming a Delta table version (or range), without loading its rows."""
    from mlflow.data.delta_dataset_source import DeltaDatasetSource
    from mlflow.data.meta_dataset import MetaDataset

    source = DeltaDatasetSource(path=snapshot.uri, delta_table_version=snapshot.version)
    versions = (
        f"v{snapshot.version}"
        if first_version in (None, snapshot.version)
        else f"v{first_version}-v{snapshot.version}"
    )
    name = f"{_table_name(snapshot.uri)}@{versions}"
    # mlflow marks Dataset.profile @abstractmethod without ABC; MetaDataset omits it and works.
    return MetaDataset(source, name=name)  # type: ignore[abstract]


def _experiment_id(name: str, artifact_location: str | None) -> str:
    import mlflow
    from mlflow.exceptions import MlflowException

    found = mlflow.get_experiment_by_name(name)
    if found is not None:
        return str(found.experiment_id)
    try:
        return str(mlflow.create_experiment(name, artifact_location=artifact_location))
    except MlflowException:
        raced = mlflow.get_experiment_by_name(name)
        if raced is None:
            raise
        return str(raced.experiment_id)


def _artifacts_beside(tracking_uri: str) -> str | None:
    prefix = "sqlite:///"
    if not tracking_uri.startswith(prefix):
        return None
    database = Path(tracking_uri[len(prefix) :].split("?", 1)[0]).resolve()
    return (database.parent / "mlartifacts").as_uri()


def check_tracking_uri(tracking_uri: str) -> None:
    """Refuse a tracking URI that would fall back to a store nobody chose."""
    if "://" not in tracking_uri and not tracking_uri.startswith("databricks"):
        raise TrackingError(
            f"tracking_uri {tracking_uri!r} has no scheme: pass e.g. "
            "'sqlite:////abs/path/mlflow.db' or 'http://127.0.0.1:5000' (mlflow's file store "
            "is refused by default and its implicit default is ./mlflow.db)"
        )


def _table_name(uri: str) -> str:
    return uri.rstrip("/").rsplit("/", 1)[-1] or "table"
