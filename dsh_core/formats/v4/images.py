"""``image/offload``: dsh 0.2.1's logged decision to stop sending some image
occurrences of earlier input messages, and the text a request sends instead.

When an image-capable route refuses a request whose images exceed its
budget, dsh (``dsh-compaction-image-offload``) appends ``{targets: [{seq,
imageIndexes}, ...]}`` and retries. The event has no surface operation: it
projects the messages of current ``user/message`` and ``tool/result`` nodes
(``projection.js``, ``project-message.js``). Each target marks the image
blocks at ``imageIndexes`` (positions among the message's top-level image
blocks, counting those already offloaded) ``offloaded: true``, on top of
the node's earlier projections; a replace that shadows the node drops them
with it. dsh's Messages adapter sends each offloaded image as a text
placeholder (``dsh-llm`` ``offloadedImageText``).
"""

from __future__ import annotations

from typing import Any, Mapping

from ...errors import SurfaceError
from ...jsonvalue import MAX_SAFE_INTEGER, FrozenDict, encode_json

__all__ = ["IMAGE_EXTENSIONS", "ImageOffloadError", "offloaded_image_text", "project_offload"]

#: The file name extension dsh names for each image media type.
IMAGE_EXTENSIONS = {"image/png": ".png", "image/jpeg": ".jpg", "image/webp": ".webp", "image/gif": ".gif"}


class ImageOffloadError(SurfaceError):
    """An ``image/offload`` dsh's projection refuses (dsh's text)."""


def _index(value: Any) -> bool:
    return type(value) is int and 0 <= value <= MAX_SAFE_INTEGER


def _offload(message: Mapping[str, Any], indexes: list[int]) -> FrozenDict:
    """dsh's ``offloadMessageImages``: the message with the image blocks at
    ``indexes`` (strictly increasing) marked offloaded."""
    content, image, selected = [], 0, 0
    for block in message["content"]:
        if block is None:  # dsh reads block.type of every block
            raise ImageOffloadError("Cannot read properties of null (reading 'type')")
        if isinstance(block, dict) and block.get("type") == "image":
            if selected < len(indexes) and image == indexes[selected]:
                if block.get("offloaded") is True:
                    raise ImageOffloadError(f"image/offload: image index {image} is already offloaded")
                block = FrozenDict({**block, "offloaded": True})
                selected += 1
            image += 1
        content.append(block)
    if selected != len(indexes):
        raise ImageOffloadError(f"image/offload: image index {indexes[selected]} does not exist")
    return FrozenDict({**message, "content": tuple(content)})


def project_offload(data: Any, nodes: Mapping[int, tuple[str, Any]],
                    projected: Mapping[int, FrozenDict]) -> dict[int, FrozenDict]:
    """dsh's ``imageOffloadProjection.project``: the messages one event's
    ``data`` rewrites, by seq. ``nodes`` holds the current surface nodes'
    ``(type, data)``, ``projected`` their messages as earlier offloads left
    them. Raises :class:`ImageOffloadError` as dsh refuses, at the first
    target that breaks a rule."""
    targets = data.get("targets") if isinstance(data, dict) and len(data) == 1 else None
    if not isinstance(targets, (list, tuple)) or not targets:
        raise ImageOffloadError("image/offload: data must contain a nonempty targets array")
    messages: dict[int, FrozenDict] = {}
    for target in targets:
        indexes = target.get("imageIndexes") if isinstance(target, dict) and len(target) == 2 else None
        if not _index(target.get("seq") if isinstance(target, dict) else None) or not isinstance(
                indexes, (list, tuple)) or not indexes:
            raise ImageOffloadError("image/offload: each target must contain a seq and nonempty imageIndexes")
        seq = target["seq"]
        if seq in messages:
            raise ImageOffloadError(f"image/offload: duplicate target seq {seq}")
        if seq not in nodes:
            raise ImageOffloadError(f"image/offload: target seq {seq} is not a current surface node")
        event_type, source = nodes[seq]
        if event_type not in ("user/message", "tool/result"):
            raise ImageOffloadError(f"image/offload: target seq {seq} must be user/message or tool/result")
        previous = -1
        for index in indexes:
            if not _index(index) or index <= previous:
                raise ImageOffloadError(
                    "image/offload: imageIndexes must be strictly increasing non-negative safe integers")
            previous = index
        message = projected.get(seq)
        if message is None:
            message = source if event_type == "user/message" else source["message"]
        messages[seq] = _offload(message, list(indexes))
    return messages


def offloaded_image_text(attachment: Mapping[str, Any], path: str | None) -> str:
    """dsh's ``offloadedImageText``: what a request sends for an offloaded
    image, given the read-only path of its normalized copy (``None``: the
    runtime could resolve none)."""
    attachment_id = attachment["attachmentId"]
    identity = (f"{encode_json(attachment['name']).decode()} ({attachment_id})" if "name" in attachment
                else attachment_id)
    head = f"image omitted to fit request image limits; {identity}."
    if path is None:
        return f"[{head} No local normalized image path is available; ask the user to attach it again if needed.]"
    media_type = attachment["mediaType"]
    return (f"[{head} Normalized copy (read-only; may be resized or re-encoded): {encode_json(path).decode()} "
            f"({attachment['width']}x{attachment['height']}px, {media_type}). Source dimensions, format, and byte "
            f"size may differ. Copy to a writable path ending in {IMAGE_EXTENSIONS[media_type]} before editing.]")
