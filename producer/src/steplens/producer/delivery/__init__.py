"""Where encoded records go: the transport (``transport``: Kafka, or memory), live while it
answers and to a bounded disk spool while it does not (``live_or_spool``, ``spool``); what a
spool holds can be sent later by hand (``spool_cli``)."""
