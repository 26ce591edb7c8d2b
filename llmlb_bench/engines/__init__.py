"""Real serving engines on a machine without a GPU: vLLM's CPU build (:mod:`.vllm`) and
llama.cpp's ``llama-server`` (:mod:`.llama`), each with a tiny random-weight model the
project writes itself (no download).

They let users without GPUs route over real engines (``llmlb engine``) and give the
replayer's tests, calibration and fidelity benchmarks an engine nobody on this project
wrote. See docs/engines.md.
"""
