"""The Kafka connector: connection config, ranges, record decoding, consume, produce, Beam source and sink.

It talks to the broker through kafka-python, the ``kafka`` extra (``kafka-fast`` adds
confluent-kafka for ``--kafka-backend confluent``).
"""

from pipelines.optional import require

require("kafka", "kafka", "The Kafka connector (pipelines.io.kafka)")
