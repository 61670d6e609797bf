"""The pure engine: a run's detectors, signals, rules, alert policy and incidents.

Nothing here imports Faust or does I/O; the worker and the offline scorer call it."""
