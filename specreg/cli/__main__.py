"""`python -m specreg.cli`: the same as the `specreg` command."""

from specreg.cli import run

run()
