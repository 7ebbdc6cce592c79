"""Errors fdlit raises for bad configuration, before any work starts."""


class ConfigError(ValueError):
    """A configuration value is invalid. The message names the dotted field and what is allowed."""

    def __init__(self, field: str, message: str):
        self.field = field
        super().__init__(f"{field}: {message}")
