"""Which paths of a sessions root changed, as Linux's inotify tells them.

A following shipper watches the root, each project folder (entries added,
removed, renamed) and each session folder (its files written too), each
folder before it is read: a change made while a folder is read, or any
time after, is told. Where inotify cannot be had (no instances left) or
its watch limit is reached, that is said once and the follower reads the
whole root every pass; when the kernel's event queue overflows (events
lost), the next pass reads all of it too.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path
from typing import Callable

from inotify_simple import INotify, flags

__all__ = ["RootWatch"]

_ENTRIES = flags.CREATE | flags.DELETE | flags.MOVED_FROM | flags.MOVED_TO | flags.ONLYDIR | flags.DONT_FOLLOW
_FILES = _ENTRIES | flags.MODIFY | flags.ATTRIB  # a session folder's log written, or its mode changed

_WATCH_LIMIT = Path("/proc/sys/fs/inotify/max_user_watches")


class RootWatch:
    """inotify watches on the folders of a root: :meth:`watch` each folder
    before reading it; :meth:`changed` says what changed since it was last
    asked, or ``None`` when the whole root is to be read (nothing watched
    yet, events lost, or inotify not to be had)."""

    def __init__(self, root: str, say: Callable[[str], None]) -> None:
        self.root = root
        self._say = say
        self._depth = root.rstrip(os.sep).count(os.sep)
        self._folders: dict[int, str] = {}  # watch descriptor -> folder
        self._lost = True  # nothing is watched yet
        self._inotify: INotify | None = None
        try:
            self._inotify = INotify(nonblocking=True)
        except OSError as error:
            self._give_up(f"inotify: {error.strerror or error}")

    def watch(self, folder: str) -> None:
        """Watch ``folder`` (the root, a project or a session folder)."""
        if self._inotify is None:
            return
        mask = _FILES if folder.count(os.sep) - self._depth == 2 else _ENTRIES
        try:
            self._folders[self._inotify.add_watch(folder, mask)] = folder
        except OSError as error:
            if error.errno in (errno.ENOENT, errno.ENOTDIR):
                return  # gone already: its parent's watch tells
            if error.errno == errno.ENOSPC:
                limit = _WATCH_LIMIT.read_text().strip() if _WATCH_LIMIT.exists() else "?"
                self._give_up(f"the inotify watch limit is reached at {len(self._folders)} folders "
                              f"(fs.inotify.max_user_watches = {limit}; raise it to follow what changed only)")
            else:
                self._give_up(f"inotify cannot watch {folder}: {error.strerror or error}")

    def changed(self) -> set[str] | None:
        """The paths that changed since the last call (a folder, or an
        entry in one), or ``None``: read the whole root."""
        if self._inotify is None:
            return None
        changed: set[str] = set()
        for event in self._inotify.read(timeout=0):
            if event.mask & flags.Q_OVERFLOW:
                self._lost = True
            if event.mask & flags.IGNORED:  # the folder was removed
                self._folders.pop(event.wd, None)
                continue
            folder = self._folders.get(event.wd)
            if folder is not None:
                changed.add(os.path.join(folder, event.name) if event.name else folder)
        if self._lost:
            self._lost = False
            return None
        return changed

    def close(self) -> None:
        """Release the watches (idempotent)."""
        if self._inotify is not None:
            self._inotify.close()
            self._inotify = None
        self._folders.clear()

    def _give_up(self, reason: str) -> None:
        self.close()
        self._say(f"following {self.root} by reading all of it every pass: {reason}")
