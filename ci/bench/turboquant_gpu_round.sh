#!/usr/bin/env bash
# One GPU call's worth of TurboQuant measurements (H100 machine, no vLLM needed):
#   1. bench_turboquant.py --sweep at head 256 (32 query heads) and 128 (16), into OUT/sweep_head*/;
#   2. each sweep's DEFAULT_DECODE choice written into mods/turboquant/files/tq_triton.py;
#   3. the benchmark again with those defaults, into OUT/turboquant_h100_head*/ (the committed tables);
#   4. OUT/tq_triton.py (the table as adopted) and everything packed into OUT/turboquant_round.tar.gz.
# Usage: bash ci/bench/turboquant_gpu_round.sh OUT
set -euo pipefail
out=${1:?usage: turboquant_gpu_round.sh OUT}
mkdir -p "$out"
# the archive is written beside OUT and moved in: tar reading the folder it writes into fails
pack() { cp mods/turboquant/files/tq_triton.py "$out/"; tar -C "$out" -czf "$out.tar.gz" . && mv "$out.tar.gz" "$out/turboquant_round.tar.gz"; }
trap pack EXIT
q_heads() { if [ "$1" = 256 ]; then echo 32; else echo 16; fi; }
for head in 256 128; do
  python3 ci/bench/bench_turboquant.py --sweep --head-size "$head" --q-heads "$(q_heads "$head")" --out "$out/sweep_head$head" \
    > "$out/sweep_head$head.log" 2>&1
  python3 ci/bench/bench_turboquant.py --apply-defaults "$out/sweep_head$head/turboquant_bench.json"
done
for head in 256 128; do
  mkdir -p "$out/turboquant_h100_head$head"
  python3 ci/bench/bench_turboquant.py --head-size "$head" --q-heads "$(q_heads "$head")" --out "$out/turboquant_h100_head$head" \
    > "$out/turboquant_h100_head$head/run.log" 2>&1
done
