"""The installed distribution's version, in a module of its own so that a module of the
package can name it without importing the package (which imports that module back)."""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

__all__ = ["__version__"]

try:
    __version__ = version("agentjct")  # the distribution's name on PyPI (README)
    """The installed distribution's version (``0.0.0`` when run from a source tree)."""
except PackageNotFoundError:  # pragma: no cover - running from a source tree
    __version__ = "0.0.0"
