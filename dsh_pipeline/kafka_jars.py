"""The Apache Kafka broker's jars, fetched once from Maven Central.

Apache Kafka's ``kafka_2.13`` with its runtime dependencies and a log4j2
backend, resolved by Maven into a user cache (``~/.cache/dsh-pipeline``)
and reused; Java 17+ and Maven are checked for with a clear error.

Maven only downloads (with strict checksums: a jar that does not match its
repository's checksum fails the fetch); the folder is then checked against
the repository's own pins, :mod:`dsh_pipeline.pins` ``kafka-<version>.sha256``,
before first use and before every start: exactly the pinned jars, each with
its pinned SHA-256, or the broker does not start.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

from dsh_core.errors import PipelineError
from dsh_pipeline.pins import verify_folder

__all__ = ["KAFKA_VERSION", "cache_root", "ensure_kafka_jars", "java_major", "require_tool"]

KAFKA_VERSION = "4.1.1"
_PINS = f"kafka-{KAFKA_VERSION}.sha256"
_LOG4J_VERSION = "2.25.4"
_SLF4J_VERSION = "2.0.17"

_POM = f"""<project xmlns="http://maven.apache.org/POM/4.0.0">
 <modelVersion>4.0.0</modelVersion>
 <groupId>dsh-pipeline</groupId><artifactId>kafka-broker-libs</artifactId><version>1</version>
 <packaging>pom</packaging>
 <dependencies>
  <dependency><groupId>org.apache.kafka</groupId><artifactId>kafka_2.13</artifactId><version>{KAFKA_VERSION}</version>
   <exclusions><exclusion><groupId>org.apache.logging.log4j</groupId><artifactId>log4j-slf4j-impl</artifactId></exclusion></exclusions>
  </dependency>
  <dependency><groupId>org.slf4j</groupId><artifactId>slf4j-api</artifactId><version>{_SLF4J_VERSION}</version></dependency>
  <dependency><groupId>org.apache.logging.log4j</groupId><artifactId>log4j-api</artifactId><version>{_LOG4J_VERSION}</version></dependency>
  <dependency><groupId>org.apache.logging.log4j</groupId><artifactId>log4j-core</artifactId><version>{_LOG4J_VERSION}</version></dependency>
  <dependency><groupId>org.apache.logging.log4j</groupId><artifactId>log4j-slf4j2-impl</artifactId><version>{_LOG4J_VERSION}</version></dependency>
 </dependencies>
</project>
"""


def cache_root() -> Path:
    """``$XDG_CACHE_HOME/dsh-pipeline`` (``~/.cache/dsh-pipeline``)."""
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "dsh-pipeline"


def require_tool(tool: str, purpose: str) -> str:
    path = shutil.which(tool)
    if path is None:
        raise PipelineError(f"{tool} not found on PATH: it is needed to {purpose} "
                            "(install Java 17+ and Maven, or point DSH_KAFKA_BOOTSTRAP at a running cluster)")
    return path


def java_major(java: str) -> int:
    done = subprocess.run([java, "-version"], capture_output=True, text=True, check=False)
    match = re.search(r'version "(\d+)(?:\.(\d+))?', done.stderr + done.stdout)
    if not match:
        raise PipelineError(f"cannot tell the Java version from `java -version`: {done.stderr.strip()[:200]}")
    major = int(match.group(1))
    return int(match.group(2)) if major == 1 and match.group(2) else major


def ensure_kafka_jars(cache: Path | None = None) -> Path:
    """The folder of broker jars, fetched from Maven Central on first use,
    checked against the pins each time (:class:`~dsh_pipeline.pins.ArtifactRefusedError`
    names a jar that does not match, or a file that is not pinned)."""
    lib_root = (cache or cache_root()) / f"kafka-{KAFKA_VERSION}"
    lib = lib_root / "lib"
    if not lib.is_dir():
        _fetch(lib_root, lib)
    verify_folder(lib, _PINS)
    return lib


def _fetch(lib_root: Path, lib: Path) -> None:
    mvn = require_tool("mvn", "fetch the Kafka broker jars from Maven Central")
    lib_root.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix="lib-", dir=lib_root))
    try:
        pom = lib_root / "pom.xml"
        pom.write_text(_POM)
        done = subprocess.run(
            [mvn, "-q", "-B", "--strict-checksums", "-f", str(pom),
             "org.apache.maven.plugins:maven-dependency-plugin:3.8.1:copy-dependencies",
             "-DincludeScope=runtime", f"-DoutputDirectory={staging}"],
            capture_output=True, text=True, check=False)
        if done.returncode != 0 or not any(staging.glob("kafka_2.13-*.jar")):
            raise PipelineError(f"fetching Kafka {KAFKA_VERSION} jars with Maven failed (exit {done.returncode}): "
                                f"{(done.stdout + done.stderr).strip()[-1500:]}")
        verify_folder(staging, _PINS)
        try:
            staging.rename(lib)
        except OSError:  # another process put the folder there meanwhile: it is checked before use
            pass
    finally:
        shutil.rmtree(staging, ignore_errors=True)
