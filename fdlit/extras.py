"""Optional dependencies: a plain install (`pip install -e .`) carries what a digits run needs; features
beyond it name the pip extra that brings theirs, in one line, before any work starts."""

import importlib.util

from fdlit.errors import ConfigError

EXTRAS = {  # module: the extra of pyproject.toml that installs it
    "opacus": "privacy",
    "cryptography": "privacy",
    "matplotlib": "report",
    "scipy": "report",
}


def require(module: str, field: str) -> None:
    """Raise ConfigError naming ``field`` and the extra to install when ``module`` cannot be found."""
    if importlib.util.find_spec(module) is None:
        extra = EXTRAS[module]
        raise ConfigError(field, f"needs {module}, which a plain install leaves out: pip install -e '.[{extra}]' "
                                 f"(or make test, which installs every extra)")
