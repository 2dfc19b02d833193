"""Code the benchmarks import, apart from the benchmarks themselves (ci/bench/*.py).

A benchmark run as `python3 ci/bench/NAME.py` has ci/bench on its path and imports these as
`benchlib.<module>`; a test puts ci/bench on the path first.

- `qwen35_shapes`: the two full-size Qwen3.5-MoE models' shapes (served benchmark, Spark estimate)
- `int8_lm_head_kernel`: the int8-lm-head module out of the mod's patch, and the tools that write it
- `int8_lm_head_hidden`: hidden states shaped like a real final-norm output
- `int8_lm_head_report`: tables, plot and README block from an int8-lm-head sweep
- `served_report`: table and plot of a served benchmark
- `served_profile`: a served decode step's kernels, from vLLM's torch-profiler trace
- `hostload`: how busy the host's CPUs were while a served window ran
- `served_archive`, `served_merge`: a served run's folder packed for the trip back, unpacked, merged
- `report_main`: the main of a benchmark that writes one JSON and one Markdown report
- `tq_bf16_decode`: the bf16 KV-cache decode yardstick of the TurboQuant benchmark
"""
