"""Speed and memory benchmarks: ratios against a baseline run in the same process tree."""

import contextlib
import subprocess
import sys
import tempfile
from pathlib import Path


def peak_rss_kb() -> int:
    """This process's peak resident set (``VmHWM``), in KiB. Unlike
    ``ru_maxrss``, which Linux carries across ``execve``, it does not count
    the parent a measured child was forked from."""
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    raise RuntimeError("no VmHWM in /proc/self/status")


def local_bootstrap(stack: contextlib.ExitStack) -> str:
    """The bootstrap address of a local broker started for this run (and
    stopped with ``stack``)."""
    from dsh_pipeline.local_kafka import LocalKafka

    broker = stack.enter_context(LocalKafka(heap="1g"))
    if broker.bootstrap is None:
        raise RuntimeError("the local broker did not start")
    return broker.bootstrap


_PROJECT = """
import asyncio, sys
from pathlib import Path
from benchmarks import peak_rss_kb
from consumers.projector import ProjectorConfig, projector_service
from dsh_kafka.config import KafkaConfig
from dsh_kafka.topics import TopicNames
bootstrap, prefix, db, expected = sys.argv[1:5]
async def main():
    service = projector_service(ProjectorConfig(kafka=KafkaConfig(bootstrap), topics=TopicNames.with_prefix(prefix),
                                                group="rss", store=Path(db)))
    stop = asyncio.Event()
    task = asyncio.create_task(service.run(stop))
    while sum(service.positions().values()) < int(expected) and not task.done():
        await asyncio.wait([task], timeout=0.2)
    stop.set()
    await task
asyncio.run(main())
print(peak_rss_kb())
"""


def projector_peak_rss_mb(bootstrap: str, prefix: str, records: int) -> float:
    """Peak RSS (MB) of a projector process reading the topics of ``prefix``
    until it has handled ``records`` records."""
    with tempfile.TemporaryDirectory() as tmp:
        child = subprocess.run([sys.executable, "-c", _PROJECT, bootstrap, prefix, str(Path(tmp) / "v.sqlite"),
                                str(records)], capture_output=True, text=True)
    if child.returncode != 0:
        raise SystemExit(f"the measured projector failed:\n{child.stdout}{child.stderr}")
    return int(child.stdout.strip().splitlines()[-1]) / 1024
