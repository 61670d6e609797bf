"""What a rank measures beside the loop's own numbers: the optimizer side (``watching``,
``watcher``, ``layers``), the DataLoader (``loader_timing``, ``loader_batches``), the
interconnect (``comm``, ``ddp_comm``) and the hardware (``hardware``: ``host_stats``,
``gpu_stats``, ``gpm``, ``allocator``)."""
