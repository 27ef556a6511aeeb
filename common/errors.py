"""The one exception type the command line turns into a clear message and a non-zero exit."""

from __future__ import annotations


class UserError(Exception):
    """Something the user can fix: bad config, missing file, unreachable source, ...

    The message says what is wrong and what to do; the CLI prints it on one line.
    """


class SourceUnavailable(UserError):
    """A data source (Yahoo, an exchange) could not be reached after retries."""
