"""What each NVML call gpusweep makes costs the first time in a fresh process (its cold reading), and warm.
  python3 nvml_cold.py     (one process per run: run it a few times)"""
import time
t = time.perf_counter
a = t()
import pynvml
b = t(); pynvml.nvmlInit(); c = t()
h = pynvml.nvmlDeviceGetHandleByIndex(0); d = t()
print("import %.1f ms, init %.1f ms, handle %.1f ms" % ((b - a) * 1e3, (c - b) * 1e3, (d - c) * 1e3))
calls = [
    ("memory_v2", lambda: pynvml.nvmlDeviceGetMemoryInfo(h, version=pynvml.nvmlMemory_v2)),
    ("compute processes", lambda: pynvml.nvmlDeviceGetComputeRunningProcesses(h)),
    ("graphics processes", lambda: pynvml.nvmlDeviceGetGraphicsRunningProcesses(h)),
    ("utilization", lambda: pynvml.nvmlDeviceGetUtilizationRates(h)),
    ("temperature", lambda: pynvml.nvmlDeviceGetTemperature(h, pynvml.NVML_TEMPERATURE_GPU)),
    ("power", lambda: pynvml.nvmlDeviceGetPowerUsage(h)),
    ("uuid", lambda: pynvml.nvmlDeviceGetUUID(h)),
    ("name", lambda: pynvml.nvmlDeviceGetName(h)),
    ("pci", lambda: pynvml.nvmlDeviceGetPciInfo(h)),
    ("minor", lambda: pynvml.nvmlDeviceGetMinorNumber(h)),
    ("cc", lambda: pynvml.nvmlDeviceGetCudaComputeCapability(h)),
    ("mig", lambda: pynvml.nvmlDeviceGetMigMode(h)),
    ("persistence", lambda: pynvml.nvmlDeviceGetPersistenceMode(h)),
]
out = []
for name, f in calls:
    x = t()
    try:
        f()
    except pynvml.NVMLError as e:
        name += " (%s)" % e
    y = t()
    f()
    z = t()
    out.append("%s %.2f/%.3f" % (name, (y - x) * 1e3, (z - y) * 1e3))
print("cold/warm ms: " + ", ".join(out))
