"""Running a command for the trainer's scripts: echo it, return its stdout, stop on failure."""
import subprocess
import sys


def run(cmd):
    print("+ " + " ".join(cmd), flush=True)
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"failed ({r.returncode}): {r.stderr[-3000:]}")
    return r.stdout
