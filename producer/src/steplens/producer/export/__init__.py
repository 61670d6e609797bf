"""The node's hardware samples served to Prometheus (``node_exporter``, opt-in)."""
