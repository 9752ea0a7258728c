"""The error of bad user input, shared by every stage that reads it."""


class ConfigError(ValueError):
    """Bad user input (a study config, a cell spec, a dataset's overrides); the message names the
    key and the value."""
