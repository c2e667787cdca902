"""Another OS user on this machine, to try the project's files and servers as a stranger would."""

from __future__ import annotations

import os
import pwd
import subprocess

import pytest

#: The user the tests create (root only) and act as.
STRANGER = "dsh-stranger"


def stranger() -> pwd.struct_passwd:
    """The other user, created with ``useradd`` when missing; a skip saying
    why where this process is not root (only root can create users and act
    as them)."""
    if os.geteuid() != 0:
        pytest.skip("acting as another OS user needs root (useradd, and a child running as that user)")
    try:
        return pwd.getpwnam(STRANGER)
    except KeyError:
        pass
    done = subprocess.run(["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", STRANGER],
                          capture_output=True, text=True, check=False)
    if done.returncode not in (0, 9):  # 9: created meanwhile by a concurrent test
        pytest.skip(f"useradd {STRANGER} failed (exit {done.returncode}): {done.stderr.strip()}")
    return pwd.getpwnam(STRANGER)


def run_as_stranger(argv: list[str], **kwargs) -> subprocess.CompletedProcess:
    """``argv`` run as :func:`stranger` (with none of root's groups)."""
    account = stranger()
    return subprocess.run(argv, user=account.pw_uid, group=account.pw_gid, extra_groups=[], cwd="/",
                          capture_output=True, text=True, check=False, timeout=60, **kwargs)
