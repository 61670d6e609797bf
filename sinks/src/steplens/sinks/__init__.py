"""steplens sinks: InfluxDB (hot), S3 Parquet (cold), query and replay."""
