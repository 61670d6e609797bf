"""Advice from the stream jobs and the remedies a run allows: the bounded inbox the loop reads
(``advice_inbox``) and where its messages come from (``advice_relay``: one reader per node, or
a consumer of the rank's own); carrying the advice out (``carry_out``): skipping samples and
batches (``skipping``), reloading a checkpoint (``rewind``), lowering the lr (``lower_lr``), a
profiler trace stored as evidence (``rank_profile``, ``trace_upload``)."""
