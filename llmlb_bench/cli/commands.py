"""Importing this module registers every command on :data:`llmlb_bench.cli.app.app`.

One module per command; add a line here when a command does something real.
"""

from llmlb_bench.cli import policies, query, report, run, simulate  # noqa: F401
from llmlb_bench.cli import gen  # noqa: F401
from llmlb_bench.cli import trace  # noqa: F401
from llmlb_bench.cli import replay  # noqa: F401
from llmlb_bench.cli import sweep  # noqa: F401
from llmlb_bench.cli import import_results  # noqa: F401
from llmlb_bench.cli import gate  # noqa: F401
from llmlb_bench.cli import serve  # noqa: F401
from llmlb_bench.cli import repro  # noqa: F401
from llmlb_bench.cli import capacity  # noqa: F401
from llmlb_bench.cli import calibrate  # noqa: F401
from llmlb_bench.cli import routers  # noqa: F401
from llmlb_bench.cli import route  # noqa: F401
from llmlb_bench.cli import engine  # noqa: F401
from llmlb_bench.cli import learn  # noqa: F401
from llmlb_bench.cli import validate  # noqa: F401
