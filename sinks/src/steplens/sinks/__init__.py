"""steplens sinks: InfluxDB (hot), S3 Parquet (cold), query and replay.

``points``/``influx``/``loop``: records to InfluxDB, committed after the write;
``cold``/``s3``/``roller_loop``: Parquet objects in S3, committed after the upload;
``rollup``: buckets and 1-minute rollups; ``query``: one series across both stores;
``replay``: cold records back into Kafka; ``retry``: the one retry policy; ``cli``: `steplens sink`.
"""
