"""Publishing from rollout workers, and the synthetic fleet the demo and benchmarks publish."""

from producers.aio import AsyncPublisher
from producers.catalog import Domain, build_catalog
from producers.delivery import DeliveryCallback, DeliveryResult
from producers.exceptions import (
    BackpressureError,
    DeliveryError,
    FleetConfigError,
    InvalidTrajectoryError,
    ProducerError,
    PublishError,
    RecordTooLargeError,
)
from producers.fleet import SyntheticFleet
from producers.lanes import TOPIC_MESSAGE_LIMITS, ULTRA_TOPIC, Lane, default_config
from producers.malformed import MALFORMED_KINDS, SEMANTIC_KINDS, malformed_messages
from producers.publisher import Publisher
from producers.validation import TrajectoryValidator

__all__ = [
    "MALFORMED_KINDS",
    "SEMANTIC_KINDS",
    "TOPIC_MESSAGE_LIMITS",
    "ULTRA_TOPIC",
    "AsyncPublisher",
    "BackpressureError",
    "DeliveryCallback",
    "DeliveryError",
    "DeliveryResult",
    "Domain",
    "FleetConfigError",
    "InvalidTrajectoryError",
    "Lane",
    "ProducerError",
    "PublishError",
    "Publisher",
    "RecordTooLargeError",
    "SyntheticFleet",
    "TrajectoryValidator",
    "build_catalog",
    "default_config",
    "malformed_messages",
]
