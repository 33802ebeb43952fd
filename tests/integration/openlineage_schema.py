"""The OpenLineage RunEvent's shape (spec 2-0-2, `RunEvent` and the facets' `BaseFacet`),
written down for the lineage tests: openlineage-python 1.54 ships no JSON schema file to
validate against (its facet and event classes are generated from the spec instead), so
the received events are checked with jsonschema against this transcription of the spec's
required fields, types and enums (of the formats, jsonschema checks date-time and uuid)."""

from __future__ import annotations

from typing import Any

_FACET = {
    "type": "object",
    "required": ["_producer", "_schemaURL"],
    "properties": {
        "_producer": {"type": "string", "format": "uri"},
        "_schemaURL": {"type": "string", "format": "uri"},
    },
}
_FACETS = {"type": "object", "additionalProperties": _FACET}
_DATASET = {
    "type": "object",
    "required": ["namespace", "name"],
    "properties": {
        "namespace": {"type": "string"},
        "name": {"type": "string"},
        "facets": _FACETS,
        "inputFacets": _FACETS,
        "outputFacets": _FACETS,
    },
}

RUN_EVENT: dict[str, Any] = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "type": "object",
    "required": ["eventTime", "producer", "schemaURL", "run", "job"],
    "properties": {
        "eventTime": {"type": "string", "format": "date-time"},
        "producer": {"type": "string", "format": "uri"},
        "schemaURL": {"type": "string", "format": "uri"},
        "eventType": {"enum": ["START", "RUNNING", "COMPLETE", "ABORT", "FAIL", "OTHER"]},
        "run": {
            "type": "object",
            "required": ["runId"],
            "properties": {"runId": {"type": "string", "format": "uuid"}, "facets": _FACETS},
        },
        "job": {
            "type": "object",
            "required": ["namespace", "name"],
            "properties": {
                "namespace": {"type": "string"},
                "name": {"type": "string"},
                "facets": _FACETS,
            },
        },
        "inputs": {"type": "array", "items": _DATASET},
        "outputs": {"type": "array", "items": _DATASET},
    },
}


def check(event: dict[str, Any]) -> None:
    """Raise jsonschema's ValidationError if ``event`` is not a well-formed RunEvent."""
    import jsonschema

    validator = jsonschema.Draft202012Validator(
        RUN_EVENT, format_checker=jsonschema.Draft202012Validator.FORMAT_CHECKER
    )
    validator.validate(event)
