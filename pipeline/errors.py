"""The one exception type a user sees as a one-line message (exit code 2), not a traceback."""


class PipelineError(Exception):
    """Bad input or configuration: the message says what, where, and how to fix it."""

    exit_code = 2


class BackendFailure(PipelineError):
    """A model or page source that failed for good (e.g. an HTTP call out of retries).

    Episode runners catch it and end only the episode it touched (`backend_error: ...`); the
    transport's own error types subclass it, so methods need not know how a backend is reached."""
