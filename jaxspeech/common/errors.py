"""The exceptions the entry points turn into one-line messages and exit codes."""


class UserError(Exception):
    """A mistake in the command, config or data: reported as one line, no traceback."""


class TrainingDiverged(Exception):
    """train.max_nonfinite_steps steps in a row had a non-finite loss or gradient."""
