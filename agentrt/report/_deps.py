"""The report's optional dependencies (the ``report`` extra), imported only when used."""

from __future__ import annotations

import importlib

__all__ = ["INSTALL_HINT", "require"]

INSTALL_HINT = 'pip install "agentjct[report]"'


def require(module: str) -> None:
    """Import ``module`` (``rich`` or ``matplotlib``), or fail with the install command."""
    try:
        importlib.import_module(module)
    except ImportError as exc:
        raise ImportError(
            f"agentrt report needs {module} (the report extra): {INSTALL_HINT}"
        ) from exc
