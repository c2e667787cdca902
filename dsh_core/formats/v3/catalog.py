"""What dsh's migration adds for a session's subagent children: its catalog.

Migrating a parent, dsh 0.2.1 lists every session of the root whose header
names it as ``parentSession`` with ``origin: "subagent"`` (see
:func:`dsh_core.migration.migrate.children_of`), reads each child, and its v3→v4 edge ends
the parent's log with one ``subagent/catalog`` per child not catalogued
yet: from the child's single own ``subagent/descriptor`` (``mode``,
``label``), or ``mode: "unknown"`` when the child cannot be read or has no
single known descriptor.
"""

from __future__ import annotations

from typing import Any

from ...errors import FormatUnsupportedError
from ..v4.fold import V4Fold

__all__ = ["catalog_children", "child_catalog_entry"]


def catalog_children(v4: V4Fold, events: list[dict[str, Any]], children: list[dict[str, Any]]) -> None:
    """dsh's v3→v4 edge at the end of a migration: a ``subagent/catalog``
    for each child session (``{childId, childCreatedAt, descriptors}``,
    see :func:`dsh_core.migration.migrate.children_of`) the log does not
    catalogue yet (after its inherited cut), folded by ``v4`` and joining
    the migrated ``events``."""
    state = v4.state
    assert state is not None, "the fold has read its header"
    catalogued: dict[Any, Any] = {}
    for event in events:
        if event["type"] == "session/end-seed" and isinstance(event["data"], dict) \
                and event["data"].get("inherited") is True:
            catalogued.clear()
        elif event["type"] == "subagent/catalog" and isinstance(event["data"], dict):
            catalogued[event["data"].get("childId")] = event["data"]
    for child in children:
        entry = child_catalog_entry(child)
        existing = catalogued.get(child["childId"])
        if existing is not None:
            if existing.get("childCreatedAt") != child["childCreatedAt"] or (
                    entry.get("version") == 0 and any(existing.get(k) != entry.get(k) for k in ("mode", "label"))):
                raise FormatUnsupportedError(f"Session {child['childId']} conflicts with its parent catalog")
            continue
        catalogued[child["childId"]] = entry
        event = {"type": "subagent/catalog", "seq": v4.count, "time": state.last_time, "data": entry}
        v4.migrated_event(event)
        events.append(event)


def child_catalog_entry(child: dict[str, Any]) -> dict[str, Any]:
    """dsh's ``childCatalogFact``: the catalog entry a child's facts give."""
    descriptors = child["descriptors"] or []
    descriptor = descriptors[0] if len(descriptors) == 1 else None
    if not isinstance(descriptor, dict) or descriptor.get("version") not in (1, 2, 3):
        return {"version": 1, "childId": child["childId"], "childCreatedAt": child["childCreatedAt"], "mode": "unknown"}
    if type(descriptor.get("provider")) is not str:
        raise FormatUnsupportedError(f"Session {child['childId']} has an invalid subagent descriptor provider")
    if descriptor["version"] != 1 and descriptor.get("mode") not in ("continuable", "one-shot"):
        raise FormatUnsupportedError(f"Session {child['childId']} has an invalid subagent descriptor mode")
    entry = {"version": 0, "childId": child["childId"], "childCreatedAt": child["childCreatedAt"],
             "mode": "continuable" if descriptor["version"] == 1 else descriptor["mode"]}
    if "label" in descriptor:
        entry["label"] = descriptor["label"]
    return entry
