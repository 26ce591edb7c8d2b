"""Allow ``python -m llmlb_bench`` as an alias of the ``llmlb`` console script."""

from llmlb_bench.cli import main

main()
