"""``llmlb serve``: the cluster simulator behind real OpenAI-compatible HTTP, in real time.

    from llmlb_bench.serve import SimServer, ServeOptions
    server = await SimServer(ClusterConfig.build(replicas=2), ServeOptions(port_per_replica=0)).start()
    server.urls   # [("r0", "http://127.0.0.1:41233"), ("r1", "http://127.0.0.1:40111")]

See docs/serve.md: what is simulated, the API, the timing guarantees and their measured accuracy.
"""

from llmlb_bench.serve.live import LiveFleet, LiveRequest, Submission
from llmlb_bench.serve.server import ServeOptions, SimServer, run

__all__ = ["LiveFleet", "LiveRequest", "ServeOptions", "SimServer", "Submission", "run"]
