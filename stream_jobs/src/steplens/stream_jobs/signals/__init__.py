"""One pure module per signal: a small dataclass state and an ``update`` function.

``update(state, ...) -> (state, signals)``.

No module here imports faust; the worker (``steplens.stream_jobs.app``) and the offline scorer
(``steplens.stream_jobs.detect_cli``) run the same code.
"""
