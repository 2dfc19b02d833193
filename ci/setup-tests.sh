#!/usr/bin/env bash
# Make the test environment: .venv with sparkmods and its `test` and `kernels` extras, torch as a
# CPU build where one can be had.
#
# The `kernels` extra pins torch (the turboquant kernels run under Triton's CPU interpreter, the tiny
# Qwen3.5 model under transformers). From PyPI, torch on Linux is the CUDA build: several GB of
# nvidia-* wheels that no test uses. So torch is installed first from PyTorch's CPU index, at the
# version pyproject.toml pins; the rest then comes from the ordinary index and keeps that torch
# (`torch==X` is satisfied by `X+cpu`). The CPU index is asked once first, 10 s at most: where
# it does not answer, the set-up says so and goes on at once (pip would retry for minutes), and
# torch comes from the ordinary index and whatever local wheels pip is configured with. The
# last line says which torch was installed, as torch itself reports it. Idempotent; the Python
# that makes .venv is $PYTHON (default python3, >= 3.10).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

readonly CPU_INDEX="${SPARKMODS_TORCH_INDEX:-https://download.pytorch.org/whl/cpu}"
say() { echo "setup-tests: $*"; }

# answers URL: whether one GET of URL succeeds within 10 s; if not, why, on stdout.
answers() {
    .venv/bin/python - "$1" <<'EOF'
import sys
import urllib.request

try:
    urllib.request.urlopen(sys.argv[1], timeout=10).close()
except Exception as exc:  # any failure means: do not wait on this index
    print(getattr(exc, "reason", None) or exc)
    sys.exit(1)
EOF
}

[[ -x .venv/bin/python ]] || "${PYTHON:-python3}" -m venv .venv
torch_pin="$(grep -o '"torch==[^"]*"' pyproject.toml | tr -d '"')" \
    || { echo "setup-tests: error: pyproject.toml pins no torch==X in the kernels extra" >&2; exit 2; }

if [[ "$(uname -s)" == Linux ]]; then
    if why="$(answers "$CPU_INDEX/torch/")"; then
        say "installing $torch_pin (CPU build) from $CPU_INDEX"
        .venv/bin/pip install -q --retries 1 --timeout 30 "$torch_pin" --index-url "$CPU_INDEX" \
            || say "note: installing from $CPU_INDEX failed; $torch_pin comes from the default index"
    else
        say "note: $CPU_INDEX does not answer ($why); $torch_pin comes from the default index"
    fi
fi
say "installing sparkmods with the test and kernels extras"
.venv/bin/pip install -q -e '.[test,kernels]'
say "ready: $(.venv/bin/python -c 'import torch; cuda = torch.version.cuda
print("torch", torch.__version__, f"(CUDA {cuda} build)" if cuda else "(CPU build)")')"
