"""GPU telemetry: read utilization, memory, temperature and power per GPU, fold the raw
samples into one-minute buckets, and store those (never the raw samples).

- `nvml`: the sampler over pynvml (the only module that touches NVML).
- `buckets`: the pure minute aggregator the agent and the embedded loop share.
- `store`: writes (bucket upserts, retention, agent tokens).
- `agent`: the loop `manage.py gpu_agent` runs on each GPU host; `hooks`: the embedded one.
"""
