"""Templated prefixes (``events/day={day}/``): their fields, and rendering them from params.

A leaf module: the task API checks templates when a module is imported, and the publisher
renders scopes, without either importing the other.
"""

from __future__ import annotations

import re
import string
from collections.abc import Mapping

from perago.errors import GuardrailError, TaskDefinitionError

__all__ = ["render_prefix", "template_fields"]

#: What one templated value may be: one plain path segment.
_SEGMENT = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._=+-]{0,127}$")


def template_fields(prefix: str) -> tuple[str, ...]:
    """The ``{field}`` names of a templated prefix, in order (``()`` for a plain prefix)."""
    try:
        parsed = list(string.Formatter().parse(prefix))
    except ValueError as e:
        raise TaskDefinitionError(
            f"workspace prefix {prefix!r} is not a valid template ({e}); write fields as "
            "'{name}', e.g. 'events/day={day}/'"
        ) from e
    fields = []
    for _literal, name, spec, conversion in parsed:
        if name is None:
            continue
        if not name.isidentifier() or spec or conversion:
            raise TaskDefinitionError(
                f"workspace prefix {prefix!r}: '{{{name}}}' must name a params field plainly "
                "(no attribute, index, format spec or conversion), e.g. 'events/day={day}/'"
            )
        fields.append(name)
    return tuple(fields)


def render_prefix(prefix: str, values: Mapping[str, object]) -> str:
    """Fill a templated prefix from params; every value must be one safe path segment.

    A bad value is a terminal error (``GuardrailError``): retrying the same params cannot
    help, and a value such as ``..`` or ``a/b`` would move the scope somewhere else.
    """
    fields = template_fields(prefix)
    if not fields:
        return prefix
    rendered = {}
    for name in fields:
        if name not in values:
            raise GuardrailError(
                f"workspace prefix {prefix!r} needs params field {name!r}, which the params "
                "do not have; add it to the params model"
            )
        value = values[name]
        text = value.value if hasattr(value, "value") else value  # enums render by value
        text = str(text)
        if isinstance(value, bool) or not _SEGMENT.match(text) or text in (".", ".."):
            raise GuardrailError(
                f"params field {name!r} = {text!r} cannot fill the workspace prefix {prefix!r}: "
                "each value must be one path segment of letters, digits and '._=+-' (no '/', "
                "not '.' or '..', at most 128 characters); fix the workflow's params"
            )
        rendered[name] = text
    return prefix.format(**rendered)
