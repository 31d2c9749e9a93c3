#!/usr/bin/env bash
# Build llama.cpp's llama-server (the engine Ollama runs) from the llama-cpp-python sdist, which vendors
# llama.cpp, and write a random-weight model, for `orchestrator bench chat --backend llama-server`.
# Nothing but the sdist comes from the network (PyPI); no weights are downloaded. About 7 minutes on
# 2 cores; the result is cached, so a second run returns at once.
#
# Needs: cmake, a C++ compiler, and `pip install 'orchestrator[bench]'` (gguf, numpy) in the same Python.
set -euo pipefail
PY=${PYTHON:-python3}
CACHE=${XDG_CACHE_HOME:-$HOME/.cache}/orchestrator/llama-server
VERSION=${LLAMA_CPP_PYTHON_VERSION:-0.3.36}
mkdir -p "$CACHE/bin"

if [ ! -x "$CACHE/bin/llama-server" ]; then
  command -v cmake >/dev/null || { echo "cmake is missing: apt-get install cmake g++" >&2; exit 1; }
  work=$(mktemp -d)
  trap 'rm -rf "$work"' EXIT
  "$PY" -m pip download --quiet --no-deps --no-binary :all: "llama-cpp-python==$VERSION" -d "$work"
  tar xzf "$work"/llama_cpp_python-*.tar.gz -C "$work"
  src=$(echo "$work"/llama_cpp_python-*/vendor/llama.cpp)
  # LLAMA_USE_PREBUILT_UI=OFF: otherwise the build tries to download a web UI.
  cmake -S "$src" -B "$work/build" -DCMAKE_BUILD_TYPE=Release -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_CURL=OFF \
    -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DBUILD_SHARED_LIBS=OFF >/dev/null
  cmake --build "$work/build" --target llama-server -j"$(nproc)"
  install -m 0755 "$work/build/bin/llama-server" "$CACHE/bin/llama-server"
fi
MODEL=$CACHE/$("$PY" -c 'from orchestrator.lab.bench.llama_server import MODEL_FILE; print(MODEL_FILE)')
[ -f "$MODEL" ] || "$PY" -m orchestrator.lab.bench.llama_model "$MODEL"
echo "llama-server: $CACHE/bin/llama-server"
echo "model:        $MODEL"
