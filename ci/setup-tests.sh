#!/usr/bin/env bash
# Make the test environment: .venv with sparkmods and its `test` extra, torch as a CPU build.
#
# The `test` extra pins torch (the turboquant kernels run under Triton's CPU interpreter, the tiny
# Qwen3.5 model under transformers). From PyPI, torch on Linux is the CUDA build: several GB of
# nvidia-* wheels that no test uses. So torch is installed first from PyTorch's CPU index, at the
# version pyproject.toml pins; the rest then comes from the ordinary index and keeps that torch
# (`torch==X` is satisfied by `X+cpu`). Where the CPU index cannot be reached, the ordinary
# index's torch is installed instead, with a note saying so. Idempotent; the Python that makes
# .venv is $PYTHON (default python3, >= 3.10).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

readonly CPU_INDEX="${SPARKMODS_TORCH_INDEX:-https://download.pytorch.org/whl/cpu}"
say() { echo "setup-tests: $*"; }

[[ -x .venv/bin/python ]] || "${PYTHON:-python3}" -m venv .venv
torch_pin="$(grep -o '"torch==[^"]*"' pyproject.toml | tr -d '"')" \
    || { echo "setup-tests: error: pyproject.toml pins no torch==X in the test extra" >&2; exit 2; }

if [[ "$(uname -s)" == Linux ]]; then
    say "installing $torch_pin (CPU build) from $CPU_INDEX"
    .venv/bin/pip install -q "$torch_pin" --index-url "$CPU_INDEX" \
        || say "note: the CPU index failed; $torch_pin comes from the default index (the CUDA build on Linux)"
fi
say "installing sparkmods with the test extra"
.venv/bin/pip install -q -e '.[test]'
say "ready: $(.venv/bin/python -c 'import torch; print("torch", torch.__version__)')"
