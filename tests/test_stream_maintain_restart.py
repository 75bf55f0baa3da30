"""After `rollstream maintain --yes`, a processor re-reading every topic under a new group writes nothing.

Compaction rewrites the data files and a checkpoint replaces the log's JSON with Parquet; the Delta
txn actions (the offsets stored with the rows) must survive both, so a worker in a NEW consumer
group, which starts again at offset 0, skips every message as a replay. The restarted worker runs
in a pseudo terminal, which also exercises the catch-up progress bar of `rollstream process`.
"""

from __future__ import annotations

import json
import os
import re
import select
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import polars as pl
import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable
from stream_support import (
    REPO,
    group_caught_up,
    group_name_fixture,  # noqa: F401 (provides the group_name fixture)
    non_code_records,
    publish,
    read_topic,
    start_worker,
    stop_worker,
    table_rows,
    wait_for,
)

from infra.cli import main
from producers.malformed import malformed_messages
from schemas import TrajectoryCodec

pytestmark = pytest.mark.timeout(600)
APP_ID = "maintain-restart"
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
SUMMARY = re.compile(r"records in (\d+), rows written (\d+), dead letters (\d+), replays skipped (\d+)")


class PtyProcess:
    """A child whose stdout and stderr are a pseudo terminal; a thread keeps what it draws."""

    def __init__(self, argv: list[str], env: dict[str, str], cwd: Path) -> None:
        master, slave = os.openpty()
        self.process = subprocess.Popen(
            argv, stdin=subprocess.DEVNULL, stdout=slave, stderr=slave, env=env, cwd=cwd
        )
        os.close(slave)
        self._master = master
        self._chunks: list[bytes] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        while True:
            ready, _, _ = select.select([self._master], [], [], 0.5)
            if ready:
                try:
                    data = os.read(self._master, 65536)
                except OSError:  # the child closed the terminal
                    return
                if not data:
                    return
                self._chunks.append(data)
            elif self.process.poll() is not None:
                return

    @property
    def screen(self) -> str:
        return b"".join(self._chunks).decode(errors="replace")

    def stop(self) -> int:
        self.process.send_signal(signal.SIGTERM)
        try:
            code = self.process.wait(timeout=90)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(timeout=10)
            raise AssertionError(f"worker ignored SIGTERM; it drew:\n{self.screen[-3000:]}") from None
        self._reader.join(timeout=10)
        os.close(self._master)
        return code


@pytest.mark.slow(49)
def test_restart_under_a_new_group_after_maintain_writes_nothing_twice(
    bootstrap_servers, make_topic, group_name, tmp_path, monkeypatch, capsys
):
    raw = make_topic("restart-raw", partitions=2)
    dlq = make_topic("restart-dlq", partitions=1, config={"max.message.bytes": "67108864"})
    codec = TrajectoryCodec()
    records = non_code_records(11, 400)
    bad = list(malformed_messages(11, 14, codec=codec))
    lake, logs = tmp_path / "lake", tmp_path / "logs"
    logs.mkdir()
    traj, letters = lake / "trajectories", lake / "dead_letters"
    half = len(records) // 2

    # 1. The first worker writes everything, in at least two commits (so compaction has work).
    publish(bootstrap_servers, raw, [(r["group_id"].encode(), codec.encode(r)) for r in records[:half]])
    log = logs / "worker-a.log"
    first_group = group_name("restart-a")
    proc = start_worker(bootstrap_servers, lake, raw, dlq, APP_ID, first_group, log)
    try:
        wait_for(lambda: table_rows(traj) >= half, 300, proc, log, "the first half")
        publish(bootstrap_servers, raw, [(r["group_id"].encode(), codec.encode(r)) for r in records[half:]])
        publish(bootstrap_servers, raw, [(key, value) for key, value, _ in bad])
        wait_for(lambda: table_rows(traj) >= len(records), 300, proc, log, "every row")
        wait_for(lambda: table_rows(letters) >= len(bad), 300, proc, log, "every dead letter")
        wait_for(lambda: group_caught_up(bootstrap_servers, first_group, raw, 2), 120, proc, log, "commits")
    finally:
        assert stop_worker(proc, log) == 0, log.read_text()[-3000:]
    rows_before = pl.read_delta(str(traj)).sort("topic", "partition", "offset")
    letters_before = table_rows(letters)
    files_before = len(DeltaTable(str(traj)).file_uris())

    # 2. Upkeep through the command line: compact, checkpoint, vacuum (--yes).
    monkeypatch.setenv("ROLLSTREAM_LAKE_URI", str(lake))
    monkeypatch.setenv("ROLLSTREAM_STATE_DIR", str(tmp_path / "state"))
    capsys.readouterr()
    assert main(["maintain", "--yes"]) == 0
    reports = {r["name"]: r for r in map(json.loads, capsys.readouterr().out.splitlines())}
    assert {"trajectories", "dead_letters"} <= set(reports)
    assert reports["trajectories"]["checkpointed"]
    table = DeltaTable(str(traj))
    assert len(table.file_uris()) < files_before  # compaction merged small files
    for uri in table.file_uris():  # rewritten with the writer's settings: no dictionary on token ids
        chunk = pq.ParquetFile(uri).metadata.row_group(0)
        encodings = {
            chunk.column(i).path_in_schema: chunk.column(i).encodings for i in range(chunk.num_columns)
        }
        tokens = next(v for k, v in encodings.items() if k.startswith("response_tokens.list."))
        assert "RLE_DICTIONARY" not in tokens and "RLE_DICTIONARY" in encodings["domain"], encodings
    assert any(p.name.endswith(".checkpoint.parquet") for p in (traj / "_delta_log").iterdir())

    # 3. The same app under a new group, in a terminal (progress bar drawn).
    second_group = group_name("restart-b")
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
        "ROLLSTREAM_KAFKA__BOOTSTRAP_SERVERS": bootstrap_servers,
        "ROLLSTREAM_STATE_DIR": str(logs),
        "ROLLSTREAM_LAKE_URI": str(lake),
        "ROLLSTREAM_KAFKA__RAW_TOPIC": raw,
        "ROLLSTREAM_KAFKA__DLQ_TOPIC": dlq,
        "COLUMNS": "120",
        "TERM": "xterm",
    }
    argv = [
        sys.executable, "-m", "infra.cli", "process", "--app-id", APP_ID, "--group-id", second_group,
        "--batch-size", "250", "--batch-within", "0.5", "--no-ultra",
    ]  # fmt: skip
    worker = PtyProcess(argv, env, logs)
    try:
        deadline = time.monotonic() + 300
        while not group_caught_up(bootstrap_servers, second_group, raw, 2):
            assert worker.process.poll() is None, f"worker exited early; it drew:\n{worker.screen[-4000:]}"
            assert time.monotonic() < deadline, f"no catch-up in 300 s; it drew:\n{worker.screen[-4000:]}"
            time.sleep(0.5)
        while "caught up" not in worker.screen and time.monotonic() < deadline:
            time.sleep(0.5)
    finally:
        code = worker.stop()
    screen = worker.screen
    assert code == 0, screen[-4000:]
    assert "catching up" in screen and "caught up:" in screen, screen[-4000:]  # the bar, then its end
    assert "\x1b[" in screen  # drawn with terminal control sequences, not plain lines

    # A new group starts each partition at the larger of its committed offset (none) and the `next`
    # stored in Delta, which maintain kept: nothing is judged again, let alone written.
    text = " ".join(ANSI.sub("", screen).split())  # log lines come wrapped to the terminal's width
    for _, rows_written, letters_written, _ in (map(int, m) for m in SUMMARY.findall(text)):
        assert (rows_written, letters_written) == (0, 0), text[-4000:]
    rows_after = pl.read_delta(str(traj)).sort("topic", "partition", "offset")
    assert rows_after.height == len(records) == rows_before.height
    assert rows_after.select("topic", "partition", "offset").equals(
        rows_before.select("topic", "partition", "offset")
    )
    assert table_rows(letters) == letters_before == len(bad)
    assert len(read_topic(bootstrap_servers, dlq, len(bad), timeout_s=10)) == len(bad)  # none sent again
