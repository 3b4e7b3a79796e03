#!/usr/bin/env bash
# Build llama.cpp's llama-server, llama-bench and llama-batched-bench for the bench's peer rows:
# the llama.cpp sources vendored in the installed llama-cpp-python's sdist, the installed wheel's
# CMAKE_ARGS (as tools/setup.sh built it; a $CMAKE_ARGS of yours is added to the flags chosen for
# this machine, as setup.sh does), cached per (version, flags) in
# ${SPRINTER_EDGE_TOOLS:-~/.cache/sprinter-edge/llama-tools}/<key>/bin/ (a no-op when cached);
# ggml-rpc-server too where the flags turn GGML_RPC on (llama.cpp has that target only then).
#   tools/build_llama_server.sh             build unless cached (about 7 minutes on 2 cores)
#   tools/build_llama_server.sh --rebuild   compile again
#   tools/build_llama_server.sh --jobs N    parallel compile jobs (default: all cores)
#   tools/build_llama_server.sh where       print the bin folder (exit 1 when not built)
# Never run it during a timing run: the compile takes every core.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-}"
if [[ -z "$PYTHON" ]]; then
  if [[ -x .venv/bin/python ]]; then PYTHON=.venv/bin/python; else PYTHON=python3; fi
fi
# cmake and ninja may be PyPI's, in the venv (tools/setup.sh installs them there when missing)
if [[ -d .venv/bin ]]; then PATH="$PWD/.venv/bin:$PATH"; fi
# Yours added to the chosen flags, as tools/setup.sh does (its own merged flags come back unchanged)
if [[ -n "${CMAKE_ARGS:-}" ]]; then
  CMAKE_ARGS="$("$PYTHON" sprinter_edge/backend/buildflags.py --cmake-args --user="$CMAKE_ARGS")"
  export CMAKE_ARGS
fi
case "${1:-}" in
  -h|--help) sed -n '2,11p' "$0"; exit 0 ;;
  where) exec "$PYTHON" sprinter_edge/backend/llama_tools.py where ;;
  *) exec "$PYTHON" sprinter_edge/backend/llama_tools.py build "$@" ;;
esac
