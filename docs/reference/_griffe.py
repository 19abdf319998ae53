"""A griffe extension for the docs site (mkdocs.yml) and tests/test_docs_site.py, so that
both see the same docstrings:

- the Sphinx-style roles of agentrt's docstrings (``:class:`Job```,
  ``:meth:`~Session.chat```) are rendered as inline code, as they read in the source;
- a method without a docstring of its own that implements a documented method of a base
  class (a LangChain callback) shows that docstring, as :func:`inspect.getdoc` and
  ``help()`` do; so does one that implements a method of a documented ``Protocol`` of
  agentrt that its class satisfies without naming it (a policy's ``push``: ``Policy``).
"""

from __future__ import annotations

import inspect
import re
from typing import Any

import griffe

_ROLE = re.compile(r":(?:class|func|meth|attr|data|mod|exc|obj):`~?([^`]+)`")


def _objects(obj: griffe.Object) -> Any:
    yield obj
    for member in obj.members.values():
        if not member.is_alias:
            yield from _objects(member)  # type: ignore[arg-type]


def _inherited(method: griffe.Object) -> str | None:
    """The docstring ``inspect.getdoc`` finds for ``method`` on its (imported) class."""
    try:
        cls = griffe.dynamic_import(method.parent.path)  # type: ignore[union-attr]
    except ImportError:  # an integration whose framework is not installed
        return None
    return inspect.getdoc(getattr(cls, method.name, None))


def _protocols(pkg: griffe.Module) -> list[griffe.Object]:
    return [
        obj
        for obj in _objects(pkg)
        if obj.is_class and any(str(base).split(".")[-1] == "Protocol" for base in obj.bases)
    ]


def _from_protocol(method: griffe.Object, protocols: list[griffe.Object]) -> str | None:
    """The docstring of ``method`` in a protocol that its class has every method of."""
    cls = method.parent
    assert cls is not None
    for protocol in protocols:
        wanted = {n for n, m in protocol.members.items() if m.is_function and n[:1] != "_"}
        doc = protocol.members.get(method.name)
        if method.name in wanted and doc is not None and doc.docstring is not None:
            has = set(cls.all_members) if hasattr(cls, "all_members") else set(cls.members)
            if wanted <= has:
                return doc.docstring.value
    return None


class AgentrtDocstrings(griffe.Extension):
    """Renders Sphinx roles as code and gives overriding methods their base's docstring."""

    def on_package(self, *, pkg: griffe.Module, **kwargs: Any) -> None:
        protocols = _protocols(pkg)
        for obj in _objects(pkg):
            if obj.docstring is None and obj.is_function and obj.parent and obj.parent.is_class:
                doc = _inherited(obj) or _from_protocol(obj, protocols)
                if doc:
                    obj.docstring = griffe.Docstring(doc, parent=obj)
            if obj.docstring is not None:
                obj.docstring.value = _ROLE.sub(r"`\1`", obj.docstring.value)
