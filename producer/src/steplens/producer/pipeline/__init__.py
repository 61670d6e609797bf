"""The worker's side: what the caller hands over (``items``, ``values``), and the worker thread
(``worker``) that turns it into records: steps enriched, windowed and sampled (``steps``,
``window``, ``step_batch``), the other kinds' payloads (``batch_stats``, ``text_scores``), a
stalled rank's stacks (``stall``), encoded and handed to delivery (``sender``)."""
