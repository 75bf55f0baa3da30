"""Publishing from rollout workers, and the synthetic fleet the demo and benchmarks publish."""

from producers.catalog import Domain, build_catalog
from producers.exceptions import FleetConfigError, ProducerError, PublishError, RecordTooLargeError
from producers.fleet import SyntheticFleet
from producers.malformed import MALFORMED_KINDS, SEMANTIC_KINDS, malformed_messages
from producers.publisher import TOPIC_MESSAGE_LIMITS, ULTRA_TOPIC, Publisher, default_config

__all__ = [
    "MALFORMED_KINDS",
    "SEMANTIC_KINDS",
    "TOPIC_MESSAGE_LIMITS",
    "ULTRA_TOPIC",
    "Domain",
    "FleetConfigError",
    "ProducerError",
    "PublishError",
    "Publisher",
    "RecordTooLargeError",
    "SyntheticFleet",
    "build_catalog",
    "default_config",
    "malformed_messages",
]
