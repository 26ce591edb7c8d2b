"""Real LLM routers under test: which backend served each request, installing and launching the
PyPI routers (vllm-router, sglang-router, smg), and the router scenario suite (docs/routers.md).

Kept import-light: ``llmlb serve`` and the replayer import :mod:`.identity` on every start."""
