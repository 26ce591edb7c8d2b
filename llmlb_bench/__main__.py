"""Allow ``python -m llmlb_bench`` as an alias of the ``llmlb`` console script."""

from llmlb_bench.cli import main

# guarded: worker processes (spawn) import the parent's main module and must not rerun the CLI
if __name__ == "__main__":
    main()
