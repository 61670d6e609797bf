"""Every rule's diagnosis hint, in one table: what to check first when it fires.

A rule's hint is its own (``spike:loss``), else its name's (``spike``); ``hint_for`` answers
"see the evidence" for a rule without one. Adding a signal adds its rules' hints here.
"""

from __future__ import annotations

HINTS: dict[str, str] = {
    # series detectors
    "spike:loss": "loss spike: inspect the batch at this step (corrupted or out-of-distribution "
    "data; its samples are in the evidence), then the lr",
    "spike:grad_norm": "gradient-norm spike: check clipping, the lr and the batch at this step "
    "(its samples and the layers that moved are in the evidence)",
    "spike:grad_norm_preclip": "pre-clip gradient-norm spike: check the lr and the batch at "
    "this step (its samples and the layers that moved are in the evidence)",
    "spike": "value far above its recent robust baseline",
    "volatility": "loss is noisy: lower the lr or raise the batch size / warmup",
    "arima": "the series left its forecast interval for several steps: a change in regime",
    "lr_schedule": "the lr does not follow the declared schedule: check the scheduler "
    "(stepping, resume, milestones)",
    "training:update_ratio": "fewer than 5 % of the parameters moved by more than 1e-3 "
    "of their size: the lr decayed to nothing or is too low, the optimizer state is "
    "broken (a reset, a huge epsilon) or the parameters are frozen",
    "training:param_norm": "parameter norm unstable: lower the lr, check weight decay "
    "(the layers that moved are in the evidence)",
    "clipping": "the gradient is clipped on most steps: every update is the clip's; "
    "the lr is too high or the data is wrong (check the batches, then lower the lr)",
    "vanishing": "the gradient norm collapsed toward zero: vanishing gradients (fp16 "
    "underflow or a stuck loss scale, a detached or frozen graph, saturated "
    "activations); the layers that moved are in the evidence",
    # record detectors
    "threshold:gpu_mem_pct": "NVML's used memory above 90 % for a GPU whose process reports "
    "no allocator (a PyTorch run's caching allocator keeps freed memory reserved, so this alone "
    "is no sign of trouble there): check that process's memory use",
    "threshold:gpu_mem_growth": "NVML's used memory drifts up and reaches 90 % within 30 "
    "minutes at this rate, on a GPU whose process reports no allocator: a leak (tensors kept "
    "across steps, a growing cache); it will run out",
    "threshold:gpu_temp_c": "GPU temperature above 85 C: clocks throttle soon; check cooling "
    "(fans, airflow, the node's neighbours)",
    "threshold:gpu_temp_drift": "GPU temperature drifts up and reaches 85 C within 30 minutes "
    "at this rate: failing cooling; the GPU will throttle",
    "memory:alloc_growth": "allocated GPU memory climbs toward the limit: a leak (tensors kept "
    "across steps: losses or outputs stored without .item()/.detach(), a growing cache) or "
    "inputs that keep growing; the time and steps left before the out-of-memory error are in "
    "the evidence (eta_min, eta_steps)",
    "memory:rss_growth": "this rank's process memory climbs toward what its host has left: a "
    "leak (batches or tensors kept across steps, a cache or a list that keeps growing, loader "
    "workers' copies); the time and steps left are in the evidence (eta_min, eta_steps)",
    "memory:alloc_retries": "the allocator is out of memory and retries after freeing its "
    "cache (each retry synchronizes the device): lower the micro-batch or sequence length, "
    "use activation checkpointing, or shard optimizer state",
    "memory:fragmentation": "the allocator retries although much of its reserved memory is "
    "free (fragmentation: blocks of changing sizes): set "
    "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True, keep tensor shapes fixed (pad to a few "
    "lengths), or lower the micro-batch",
    "memory:ooms": "the allocator raised an out-of-memory error: see the allocated, reserved "
    "and limit bytes in the evidence; lower the micro-batch or use activation checkpointing",
    "threshold:gpu_util": "GPU mostly idle: the input pipeline or communication is starving it",
    "threshold:comm_latency_ms": "slow collective: check the interconnect and the peer ranks",
    "threshold:disk_io_latency_ms": "slow storage: data loading or checkpointing waits on disk",
    "threshold:host_mem_available_pct": "host memory nearly exhausted: data loader workers, "
    "pinned buffers or a leak",
    "threshold:data_wait_share": "steps spend a large share waiting for data",
    "data:over_length_share": "many samples longer than the maximum length are truncated",
    "data:label_imbalance": "labels are imbalanced worse than 1:100: check sampling and labels",
    "data:duplicate_rate": "the same samples on several ranks in one step: check sharding (a "
    "DistributedSampler per rank) and the sampler seed",
    "data:repeat_rate": "samples repeat within the epoch: duplicates in the corpus or a loader "
    "that restarts; a new epoch? pass epoch= to log_batch",
    "data:repeat_share": "a large share of this epoch's samples were seen before in it: "
    "deduplicate the corpus or check the loader's resume",
    "hardware:xid_count": "the GPU driver reported an XID error (see xid_last): check the GPU "
    "and its host (nvidia-smi -q, the kernel log); drain the node and resume from the last "
    "checkpoint",
    "hardware:ecc_uncorrected": "uncorrectable ECC errors in GPU memory: results since then are "
    "suspect; drain the node, resume from the last checkpoint and have the GPU checked",
    "plateau": "the validation metric stopped improving: consider early stopping or the lr",
    "perplexity": "perplexity does not match exp(validation loss): check the evaluation script",
    "generalization_gap": "validation loss pulls away from training loss: overfitting",
    "eval_unstable": "unstable validation metrics: evaluate more often and judge the mean of "
    "several results (the interval the results support is the evidence's advice), then check "
    "for leakage and the evaluation script",
    "straggler": "one rank is consistently slower: check its GPU, host and data loading",
    "straggler:data_wait_share": "one rank waits for its data while the others wait for it at "
    "their collectives: check this rank's data loading (its loader workers, its disk, its shard)",
    "hang": "no progress while records still arrive: a hang (collective or data "
    "loader); the stuck rank's stacks are in the evidence when it sent them",
    "baseline": "outside its normal range (the band its previous 7 days, or this run, "
    "predict) for several minutes: compare with the same GPU's or host's other series and its "
    "neighbours (cooling, power capping, a noisy neighbour, a failing device)",
    "baseline:step_time_s": "steps slower than their normal range for several minutes: check "
    "this rank's GPU, host, data loading and the interconnect",
    "baseline:tokens_per_s": "throughput below its normal range for several minutes: check "
    "this rank's GPU, host, data loading and the interconnect",
    # the detector's own signals and the correlation rules
    "nonfinite": "a non-finite value: check the last batch, the loss scaling and the lr; "
    "resume from the last good checkpoint",
    "correlation:loss_grad": "loss rising while the gradient norm is abnormal: check the data "
    "pipeline first, then the optimizer state, then lower the learning rate",
    "correlation:data_bottleneck": "low GPU util with high data-loading time or I/O latency: "
    "data loading is the bottleneck",
    "correlation:eval_unstable": "unstable validation metrics: evaluate more often and judge "
    "the mean of several results (the interval the results support is the evidence's advice), "
    "then check for leakage and the evaluation script",
}


def hint_for(rule: str) -> str:
    return HINTS.get(rule) or HINTS.get(rule.split(":", 1)[0]) or "see the evidence"
