"""The package's metadata and the lock: every requirement pyproject.toml
declares (base and extras) is pinned in requirements.lock, with hashes, at a
version the requirement allows."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[2]


def _pins() -> dict[str, tuple[str, str]]:
    """name → (version, the pin's whole entry) from requirements.lock."""
    text = (ROOT / "requirements.lock").read_text()
    entries = re.split(r"\n(?=[A-Za-z0-9])", text)
    pins = {}
    for entry in entries:
        match = re.match(r"([A-Za-z0-9_.\-]+)(?:\[[^\]]*\])?==([^\s;\\]+)", entry)
        if match:
            pins[re.sub(r"[-_.]+", "-", match.group(1)).lower()] = (match.group(2), entry)
    return pins


def _declared() -> list[Requirement]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    requirements = [Requirement(line) for line in project["dependencies"]]
    for extra in project["optional-dependencies"].values():
        requirements.extend(Requirement(line) for line in extra)
    return [r for r in requirements if r.name != project["name"]]


def test_every_declared_requirement_is_pinned_with_hashes():
    pins = _pins()
    problems = []
    for requirement in _declared():
        name = re.sub(r"[-_.]+", "-", requirement.name).lower()
        if name not in pins:
            problems.append(f"{requirement}: not in requirements.lock (run make lock)")
            continue
        version, entry = pins[name]
        if not requirement.specifier.contains(version, prereleases=True):
            problems.append(f"{requirement}: the lock pins {version} (run make lock)")
        if "--hash=sha256:" not in entry:
            problems.append(f"{name}=={version}: pinned without a hash")
    assert not problems, "\n".join(problems)


def test_the_wheel_carries_its_license_and_metadata():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert project["license"] == "Apache-2.0" and project["license-files"] == ["LICENSE"]
    assert (ROOT / "LICENSE").is_file() and project["readme"] == "README.md"
    assert "Programming Language :: Python :: 3.11" in project["classifiers"]


def test_the_wheel_names_where_the_project_lives():
    urls = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["urls"]
    assert sorted(urls) == ["Documentation", "Homepage", "Issues", "Source"]
    home = urls["Homepage"]
    assert home.startswith("https://") and urls["Source"] == home, urls
    assert urls["Issues"] == f"{home}/issues" and urls["Documentation"].startswith(f"{home}/"), urls
