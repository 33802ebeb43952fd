"""Named read-only inputs: the folders a task reads beside the one it writes.

A task declares them in ``WorkspaceSpec(inputs={"facts": "clean/month={month}/", ...})``;
each attempt resolves every input to one commit before its body runs (the workspace's input
ref by default, or where the workflow points it), hands the body a read-only view of each,
and records ``name -> repository@commit/prefix`` in its publication and its task output.
A leaf module: the task API, the runtime and the publisher all use it.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Generic, Literal, TypeVar

from perago._api.prefix_templates import template_fields
from perago.core import lakefs_names as names
from perago.errors import GuardrailError, TaskDefinitionError

__all__ = [
    "ISOLATION_LEVELS",
    "Inputs",
    "Isolation",
    "ResolvedInput",
    "check_input_name",
    "template_overlap",
    "unknown_override",
]

Isolation = Literal["snapshot", "serializable"]
ISOLATION_LEVELS: tuple[Isolation, ...] = ("snapshot", "serializable")

_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,63}$")
_METADATA_KEY = f"{names.METADATA_PREFIX}input."

T = TypeVar("T")


def check_input_name(name: object) -> str:
    """An input name is a Python identifier of at most 64 characters (it is a metadata key
    and the key the workflow overrides it by)."""
    if not isinstance(name, str) or not _NAME.match(name):
        raise TaskDefinitionError(
            f"input name {name!r} is not valid: use letters, digits and '_', starting with a "
            'letter or \'_\' (at most 64), e.g. inputs={"customers": "dims/customers/"}'
        )
    return name


def _segments(template: str) -> list[str]:
    return [s for s in template.split("/") if s]


def template_overlap(a: str, b: str) -> Literal["never", "maybe", "always"]:
    """Whether two (templated) prefixes overlap once rendered: one is a path-segment prefix
    of the other. ``maybe`` when it depends on the params (a segment with a field on either
    side), which the runtime then checks on the rendered prefixes."""
    sa, sb = _segments(a), _segments(b)
    verdict: Literal["never", "maybe", "always"] = "always"
    for x, y in zip(sa, sb, strict=False):
        if x == y:  # the same literal, or the same template: rendered alike
            continue
        if not (template_fields(x) or template_fields(y)):
            return "never"
        hx, hy = x.split("{", 1)[0], y.split("{", 1)[0]  # the literal text before a field
        if not (hx.startswith(hy) or hy.startswith(hx)):
            return "never"
        verdict = "maybe"
    return verdict


@dataclass(frozen=True)
class ResolvedInput:
    """One input of one attempt: where it was read, down to the commit."""

    name: str
    repository: str
    #: What the workflow asked for ("" for the default: the workspace's input ref).
    ref: str
    commit: str
    prefix: str
    #: Read from the branch the attempt publishes to (the default source, or that branch
    #: named as the ref): what serializable isolation checks at publish time.
    on_target: bool

    @property
    def location(self) -> str:
        """``repository@commit/prefix``: what the publication's metadata records."""
        return f"{self.repository}@{self.commit}/{self.prefix}"

    def metadata(self) -> dict[str, str]:
        return {f"{_METADATA_KEY}{self.name}": self.location}

    def as_output(self) -> dict[str, str]:
        """The input as the task output lists it."""
        return {
            "repository": self.repository,
            "ref": self.ref or self.commit,
            "commit": self.commit,
            "prefix": self.prefix,
        }

    @classmethod
    def parse(cls, name: str, location: str) -> ResolvedInput:
        """The input a ``repository@commit/prefix`` record names (its ref is unknown)."""
        repository, _, rest = location.partition("@")
        commit, _, prefix = rest.partition("/")
        return cls(name, repository, "", commit, prefix, on_target=False)

    @staticmethod
    def from_metadata(metadata: Mapping[str, str]) -> dict[str, str]:
        """``name -> repository@commit/prefix`` of the inputs a commit's metadata records."""
        return {
            k[len(_METADATA_KEY) :]: v for k, v in metadata.items() if k.startswith(_METADATA_KEY)
        }


class Inputs(Mapping[str, T], Generic[T]):
    """What a body's ``inputs`` parameter gets: each input's name to a read-only local
    ``Path`` (local projection) or an ``s3a://`` URI at the input's commit (in place).

    ``inputs.source(name)`` tells where it was read (repository, commit, prefix).
    """

    def __init__(self, views: Mapping[str, T], sources: Mapping[str, ResolvedInput]) -> None:
        self._views = dict(views)
        self._sources = dict(sources)

    def __getitem__(self, name: str) -> T:
        try:
            return self._views[name]
        except KeyError:
            raise KeyError(
                f"no input named {name!r}: this task declares {sorted(self._views) or 'none'} "
                "(WorkspaceSpec(inputs=...))"
            ) from None

    def __iter__(self) -> Iterator[str]:
        return iter(self._views)

    def __len__(self) -> int:
        return len(self._views)

    def __repr__(self) -> str:
        return f"Inputs({self._views!r})"

    def source(self, name: str) -> ResolvedInput:
        """Where input ``name`` was read: repository, commit and prefix."""
        self[name]  # the same KeyError for an unknown name
        return self._sources[name]


def unknown_override(names_: list[str], declared: Mapping[str, str], task: str) -> GuardrailError:
    """The error for a workflow that overrides inputs a task does not declare."""
    return GuardrailError(
        f'the task input\'s "inputs" names {names_}, which {task} does not declare (its inputs '
        f"are {sorted(declared) or 'none'}); fix the workflow's task input"
    )
