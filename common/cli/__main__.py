"""`python -m common.cli`: the `marketgpt` command."""

from common.cli import entry

entry()
