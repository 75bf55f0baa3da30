"""The Delta tables' Arrow schemas: the contract between the stream stage that writes them and
the learners and analysts that read them. Token sequences are ordinary list columns here.

trajectories: `bucket` is a bucket name of the inference workload profile whose id is
`profile_id` (schemas/profile.py); `group_status` says how the row's advantage was decided;
`verifier` and `verifier_version` name what scored `reward` (and its `reward_components`).
"""

import pyarrow as pa

TIMESTAMP = pa.timestamp("us", tz="UTC")

TRAJECTORIES_SCHEMA = pa.schema(
    [
        ("trajectory_id", pa.string()),
        ("group_id", pa.string()),
        ("sample_index", pa.int32()),
        ("group_size", pa.int32()),
        ("domain", pa.string()),
        ("task_type", pa.string()),
        ("policy_version", pa.int64()),
        ("prompt_tokens", pa.list_(pa.int32())),
        ("response_tokens", pa.list_(pa.int32())),
        ("response_logprobs", pa.list_(pa.float32())),
        ("response_text", pa.string()),
        ("finish_reason", pa.string()),
        ("worker_id", pa.string()),
        ("created_at", TIMESTAMP),
        ("metadata", pa.map_(pa.string(), pa.string())),
        ("reward", pa.float64()),
        ("reward_components", pa.map_(pa.string(), pa.float64())),
        ("verifier", pa.string()),
        ("verifier_version", pa.string()),
        ("verifier_status", pa.string()),
        ("domain_reward", pa.float64()),
        ("advantage", pa.float64()),
        ("group_status", pa.string()),
        ("length", pa.int32()),
        ("bucket", pa.string()),
        ("profile_id", pa.string()),
        ("ingested_at", TIMESTAMP),
        ("topic", pa.string()),
        ("partition", pa.int32()),
        ("offset", pa.int64()),
    ]
)

DEAD_LETTERS_SCHEMA = pa.schema(
    [
        ("reason", pa.string()),
        ("error_type", pa.string()),
        ("raw", pa.binary()),
        ("key", pa.binary()),
        ("topic", pa.string()),
        ("partition", pa.int32()),
        ("offset", pa.int64()),
        ("failed_at", TIMESTAMP),
    ]
)

EXECUTIONS_SCHEMA = pa.schema(
    [
        ("trajectory_id", pa.string()),
        ("execution_index", pa.int32()),
        ("domain", pa.string()),
        ("verifier", pa.string()),
        ("verifier_version", pa.string()),
        ("environment_id", pa.string()),
        ("limits", pa.map_(pa.string(), pa.float64())),
        ("verdict", pa.string()),
        ("outcome", pa.string()),
        ("exit_code", pa.int32()),
        ("signal", pa.int32()),
        ("cpu_s", pa.float64()),
        ("wall_s", pa.float64()),
        ("peak_memory_bytes", pa.int64()),
        ("stdout", pa.string()),
        ("stderr", pa.string()),
        ("stdout_bytes", pa.int64()),
        ("stderr_bytes", pa.int64()),
        ("executed_at", TIMESTAMP),
        ("topic", pa.string()),
        ("partition", pa.int32()),
        ("offset", pa.int64()),
    ]
)
"""executions: one audit row per sandbox execution (`verdict` is the trajectory's verifier status,
`outcome` how the sandboxed process ended); exactly once per Kafka offset like the rows."""

RESCORES_SCHEMA = pa.schema(
    [
        ("trajectory_id", pa.string()),
        ("domain", pa.string()),
        ("old_reward", pa.float64()),
        ("old_status", pa.string()),
        ("old_verifier", pa.string()),
        ("old_verifier_version", pa.string()),
        ("new_reward", pa.float64()),
        ("new_status", pa.string()),
        ("new_verifier", pa.string()),
        ("new_verifier_version", pa.string()),
        ("new_reward_components", pa.map_(pa.string(), pa.float64())),
        ("source_table_version", pa.int64()),
        ("rescore_id", pa.string()),
        ("rescored_at", TIMESTAMP),
    ]
)
"""rescores: a verifier version's verdicts beside the stored ones (`rollstream rescore`)."""

POLICIES_SCHEMA = pa.schema(
    [
        pa.field("number", pa.int64(), nullable=False),
        pa.field("step", pa.int64(), nullable=False),
        pa.field("path", pa.string(), nullable=False),
        pa.field("sha256", pa.string(), nullable=False),
        pa.field("size_bytes", pa.int64(), nullable=False),
        pa.field("run_id", pa.string()),
        pa.field("table_version", pa.int64()),
        pa.field("created_at", TIMESTAMP, nullable=False),
    ]
)
"""policies: one row per published policy version (schemas/policy_version.py), the publication
itself: a version exists once its row is committed (consumers/weights/)."""
