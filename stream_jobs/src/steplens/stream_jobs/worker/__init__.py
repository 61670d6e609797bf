"""The Faust worker: the engine wired to Kafka, its stores, warm starts and notifiers."""
