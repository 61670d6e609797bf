"""The Faust worker: the engine wired to Kafka, its stores and warm starts."""
