#!/usr/bin/env bash
# The equal-compute staged-training experiment on one GPU: the same protocol as the CPU default
# (eval/experiments/equal_compute.py), with the GPU profile: 10 seeds, T = 1,500 target steps (3x the CPU
# horizon), 16 single-process runs at once on the one device. Budgeted for under 8 minutes on one H200-class GPU
# (not yet measured there). Never run in CI.
#
#   bash eval/experiments/gpu_staged.sh                      # results in eval/results/equal_compute_gpu/
#   bash eval/experiments/gpu_staged.sh --seeds 16           # any growlm-experiment flag passes through
#   GROWLM_DEVICE=cpu bash eval/experiments/gpu_staged.sh --quick --out runs/gpu_smoke --report runs/gpu_smoke/r
#                                                            # the CPU smoke test (tests/distributed)
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=python3
[ -x .venv/bin/python ] && PY=.venv/bin/python
DEVICE="${GROWLM_DEVICE:-cuda}"
if [ "$DEVICE" = cuda ] && ! "$PY" -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)'; then
    echo "gpu_staged.sh: no CUDA device visible to torch; set GROWLM_DEVICE=cpu for the CPU smoke test" >&2
    exit 2
fi
exec "$PY" -m growlm.eval.experiments.cli --device "$DEVICE" --out runs/equal_compute_gpu \
    --report eval/results/equal_compute_gpu "$@"
