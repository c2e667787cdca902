"""Speed and memory benchmarks: ratios against a baseline run in the same process tree."""


def peak_rss_kb() -> int:
    """This process's peak resident set (``VmHWM``), in KiB. Unlike
    ``ru_maxrss``, which Linux carries across ``execve``, it does not count
    the parent a measured child was forked from."""
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    raise RuntimeError("no VmHWM in /proc/self/status")
