"""A parent that starts a CUDA child and never waits for it: the child exits and stays a zombie.
Prints `PARENT <pid> CHILD <pid>`; the child holds GB for SECONDS, then exits."""
import os, subprocess, sys, time

here = os.path.dirname(os.path.abspath(__file__))
gb = sys.argv[1] if len(sys.argv) > 1 else "5"
secs = sys.argv[2] if len(sys.argv) > 2 else "4"
child = subprocess.Popen([sys.executable, os.path.join(here, "hold.py"), gb, secs])
print(f"PARENT {os.getpid()} CHILD {child.pid}", flush=True)
time.sleep(3600)  # never child.wait()
