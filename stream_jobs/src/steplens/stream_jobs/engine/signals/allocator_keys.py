"""The keys of a GPU entry's allocator figures (``producer/allocator.py`` writes them): read by
``gpu_memory`` (their judgment) and ``thresholds`` (the NVML share only where they are absent)."""

ALLOCATED, RESERVED, PEAK = "torch_allocated_bytes", "torch_reserved_bytes", "torch_peak_bytes"
LIMIT, RETRIES, OOMS = "torch_limit_bytes", "torch_alloc_retries", "torch_ooms"
