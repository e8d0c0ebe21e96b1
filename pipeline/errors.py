"""The one exception type a user sees as a one-line message (exit code 2), not a traceback."""


class PipelineError(Exception):
    """Bad input or configuration: the message says what, where, and how to fix it."""

    exit_code = 2
