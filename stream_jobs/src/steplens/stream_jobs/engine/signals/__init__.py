"""One module per signal: its settings and state dataclasses and one update over arrays
(``registry.py`` lists them all).

No module here imports faust; the worker (``steplens.stream_jobs.worker.app``) and the
offline scorer (``steplens.stream_jobs.offline.cli``) run the same code.
"""
