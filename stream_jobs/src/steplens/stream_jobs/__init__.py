"""steplens stream jobs: per-run state, signals and alerts from the raw telemetry."""
