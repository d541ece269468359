"""What the benchmark reports say about the machine they ran on."""
import platform
import subprocess


def cpu_model():
    for line in open("/proc/cpuinfo"):
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown"


def mem_total():
    for line in open("/proc/meminfo"):
        if line.startswith("MemTotal"):
            return f"{int(line.split()[1]) / 1024 / 1024:.0f} GiB RAM"
    return "unknown RAM"


def version(cmd):
    """The first line a command prints about its version, or `unknown`."""
    try:
        return subprocess.run(cmd, capture_output=True, text=True).stdout.strip().splitlines()[0]
    except (OSError, IndexError):
        return "unknown"
