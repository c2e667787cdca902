"""Every downloaded artifact is checked against the repository's pins
before use: a jar, wheel or tarball whose bytes differ, a file with no pin,
or an extra file in the broker's jar folder is refused by name."""

from __future__ import annotations

import hashlib
import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

import dsh_pipeline.dsh_runtimes as dsh_runtimes
import dsh_pipeline.pins as pins
from dsh_pipeline.kafka_jars import KAFKA_VERSION, cache_root, ensure_kafka_jars
from dsh_pipeline.local_kafka import LocalKafka
from dsh_pipeline.pins import ArtifactRefusedError, verify_file, verify_folder
from tests.conftest import ROOT

GOOD, BAD = b"the pinned bytes\n", b"the pinned bytes, altered\n"


@pytest.fixture
def pinned_folder(tmp_path, monkeypatch) -> Path:
    """A pins file ``fake.sha256`` pinning two small files, and a folder holding them."""
    monkeypatch.setattr(pins, "PINS", tmp_path)
    folder = tmp_path / "lib"
    folder.mkdir()
    for name in ("a.jar", "b.jar"):
        (folder / name).write_bytes(GOOD + name.encode())
    (tmp_path / "fake.sha256").write_text("".join(f"{pins.sha256_of(path)}  {path.name}\n"
                                                  for path in sorted(folder.iterdir())))
    return folder


def test_the_pinned_files_pass(pinned_folder):
    verify_folder(pinned_folder, "fake.sha256")
    verify_file(pinned_folder / "a.jar", "fake.sha256")


def test_an_altered_file_is_refused_naming_it_with_the_expected_and_the_got_hash(pinned_folder):
    expected = pins.sha256_of(pinned_folder / "b.jar")
    (pinned_folder / "b.jar").write_bytes(BAD)
    message = re.escape(f"{pinned_folder / 'b.jar'}: SHA-256 {hashlib.sha256(BAD).hexdigest()}, expected {expected} "
                        f"(pinned in {pinned_folder.parent / 'fake.sha256'})")
    for check in (lambda: verify_file(pinned_folder / "b.jar", "fake.sha256"),
                  lambda: verify_folder(pinned_folder, "fake.sha256")):
        with pytest.raises(ArtifactRefusedError, match=message + ": b.jar was altered or is not the pinned release"):
            check()


def test_a_folder_with_an_extra_or_a_missing_file_is_refused_naming_them(pinned_folder):
    (pinned_folder / "evil.jar").write_bytes(GOOD)
    (pinned_folder / "a.jar").unlink()
    with pytest.raises(ArtifactRefusedError, match=re.escape(
            f"{pinned_folder} is not the pinned set of {pinned_folder.parent / 'fake.sha256'}: not pinned: evil.jar; "
            f"missing: a.jar: refused (remove {pinned_folder} to fetch it again)")):
        verify_folder(pinned_folder, "fake.sha256")


def test_a_file_without_a_pin_is_refused(pinned_folder):
    (pinned_folder / "c.whl").write_bytes(GOOD)
    with pytest.raises(ArtifactRefusedError, match="no SHA-256 for c.whl is pinned in .*fake.sha256: refused"):
        verify_file(pinned_folder / "c.whl", "fake.sha256")


@pytest.fixture
def broker_jars(tmp_path, monkeypatch) -> Path:
    """A copy of the broker's real jar folder, in a cache of this test's own."""
    lib = cache_root() / f"kafka-{KAFKA_VERSION}" / "lib"
    if not lib.is_dir():
        pytest.skip(f"the Kafka jars are not fetched ({lib}): `make kafka-jars` fetches them")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    copy = cache_root() / f"kafka-{KAFKA_VERSION}" / "lib"
    shutil.copytree(lib, copy)
    return copy


def test_the_fetched_broker_jars_are_exactly_the_pinned_set(broker_jars):
    assert ensure_kafka_jars() == broker_jars
    assert sorted(path.name for path in broker_jars.iterdir()) == sorted(pins.pinned(f"kafka-{KAFKA_VERSION}.sha256"))


def test_a_tampered_jar_stops_the_broker_before_it_starts(broker_jars, tmp_path):
    jar = next(broker_jars.glob("kafka-clients-*.jar"))
    with open(jar, "r+b") as stream:  # one byte changed, the size kept
        stream.seek(100)
        byte = stream.read(1)[0]
        stream.seek(100)
        stream.write(bytes([byte ^ 1]))
    with pytest.raises(ArtifactRefusedError, match=f"{re.escape(str(jar))}: SHA-256 [0-9a-f]{{64}}, expected "
                                                   f"[0-9a-f]{{64}} .*: {jar.name} was altered"):
        LocalKafka(tmp_path / "broker").start()
    assert not (tmp_path / "broker" / "server.properties").exists()


def test_an_extra_jar_in_the_folder_stops_the_broker_before_it_starts(broker_jars, tmp_path):
    shutil.copy(next(broker_jars.glob("kafka-clients-*.jar")), broker_jars / "zz-plugin.jar")
    with pytest.raises(ArtifactRefusedError, match=f"{re.escape(str(broker_jars))} is not the pinned set of .*: "
                                                   "not pinned: zz-plugin.jar: refused"):
        LocalKafka(tmp_path / "broker").start()
    assert not (tmp_path / "broker" / "server.properties").exists()


def test_a_runtime_wheel_whose_bytes_differ_from_its_pin_is_never_unpacked(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    wheel = "deepseek_harness_runtime_bin-0.2.1rc2-py3-none-manylinux_2_28_x86_64.whl"

    def pip_download(argv, **_):  # what a poisoned index or a proxy would hand pip
        (Path(argv[argv.index("-d") + 1]) / wheel).write_bytes(BAD)
        return subprocess.CompletedProcess(argv, 0, "", "")

    monkeypatch.setattr(dsh_runtimes.subprocess, "run", pip_download)
    with pytest.raises(ArtifactRefusedError, match=f"{wheel}: SHA-256 {hashlib.sha256(BAD).hexdigest()}, expected "
                                                   f"{pins.pinned(dsh_runtimes.WHEEL_PINS)[wheel]}"):
        dsh_runtimes.runtime_executable("0.2.1rc2")
    assert not (dsh_runtimes.runtimes_root() / "0.2.1rc2" / ".complete").exists()
    wheel = "deepseek_harness_runtime_bin-9.9.9-py3-none-manylinux_2_28_x86_64.whl"
    with pytest.raises(ArtifactRefusedError, match=f"no SHA-256 for {wheel} is pinned in .*dsh-runtimes.sha256"):
        dsh_runtimes.runtime_executable("9.9.9")


@pytest.mark.parametrize("folder", ["tools/reference", "tests/oracle/node22"])
def test_npm_packages_install_from_a_lock_file_pinning_each_tarball_s_integrity(folder):
    manifest = json.loads((ROOT / folder / "package.json").read_text())
    locked = json.loads((ROOT / folder / "package-lock.json").read_text())["packages"]
    assert {name: locked[f"node_modules/{name}"]["version"] for name in manifest["dependencies"]} == \
        manifest["dependencies"]
    assert all(entry["integrity"].startswith("sha512-") for path, entry in locked.items() if path)


def test_the_runtime_make_setup_installs_is_installed_by_its_pinned_hash():
    """make setup installs requirements.lock with --require-hashes; its entry
    for dsh's runtime holds the hash dsh_pipeline/pins pins for that wheel."""
    lock = (ROOT / "requirements.lock").read_text()
    version, hashes = re.search(r"^deepseek-harness-runtime-bin==(\S+) \\\n((?:    --hash=sha256:[0-9a-f]{64}.*\n)+)",
                                lock, re.M).groups()
    wheel = f"deepseek_harness_runtime_bin-{version}-py3-none-manylinux_2_28_x86_64.whl"
    assert pins.pinned(dsh_runtimes.WHEEL_PINS)[wheel] in re.findall(r"sha256:([0-9a-f]{64})", hashes)
    assert f"deepseek-harness-runtime-bin=={version};" in (ROOT / "pyproject.toml").read_text().replace(" ;", ";")
    assert "pip install --quiet --require-hashes --no-deps -r requirements.lock" in (ROOT / "Makefile").read_text()
