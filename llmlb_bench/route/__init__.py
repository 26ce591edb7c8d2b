"""``llmlb route``: llmlb's routing policies as a live OpenAI-compatible proxy (docs/routers.md)."""

from llmlb_bench.route.proxy import RouteOptions, RouteProxy

__all__ = ["RouteOptions", "RouteProxy"]
