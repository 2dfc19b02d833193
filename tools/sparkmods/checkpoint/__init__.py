"""Safetensors checkpoint tools: inspect, add-mtp, build-hybrid.

Checkpoints are 70-120 GB on a 128 GB machine, so everything here works from the
safetensors headers (a few KB per shard) and streams tensor data by byte ranges when it
has to write: peak memory never depends on the checkpoint or shard size.
"""
