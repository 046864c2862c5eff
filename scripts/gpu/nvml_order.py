"""Whether a cold NVML reading can be made cheaper: init flags, call order, calls in parallel threads, one
batched field-values call. One fresh process per mode:
  python3 nvml_order.py MODE     MODE: plain | noattach | util-first | parallel | fields
(noattach: NVML_INIT_FLAG_NO_ATTACH; on the H200 the handle then fails with InvalidArgument)"""
import sys, threading, time
t = time.perf_counter
import pynvml as n
mode = sys.argv[1]
a = t()
if mode == "noattach":
    n.nvmlInitWithFlags(2)  # NVML_INIT_FLAG_NO_ATTACH
else:
    n.nvmlInit()
b = t(); h = n.nvmlDeviceGetHandleByIndex(0); c = t()
log = ["init %.2f" % ((b - a) * 1e3), "handle %.2f" % ((c - b) * 1e3)]
def timed(name, f):
    x = t()
    try:
        f()
    except n.NVMLError as e:
        name += "(%s)" % e
    log.append("%s %.2f" % (name, (t() - x) * 1e3))
mem = lambda: n.nvmlDeviceGetMemoryInfo(h, version=n.nvmlMemory_v2)
procs = lambda: n.nvmlDeviceGetComputeRunningProcesses(h)
util = lambda: n.nvmlDeviceGetUtilizationRates(h)
temp = lambda: n.nvmlDeviceGetTemperature(h, n.NVML_TEMPERATURE_GPU)
power = lambda: n.nvmlDeviceGetPowerUsage(h)
g0 = t()
if mode in ("plain", "noattach"):
    for k, f in [("mem", mem), ("procs", procs), ("util", util), ("temp", temp), ("power", power)]:
        timed(k, f)
elif mode == "util-first":
    for k, f in [("util", util), ("power", power), ("temp", temp), ("mem", mem), ("procs", procs)]:
        timed(k, f)
elif mode == "parallel":
    ts = [threading.Thread(target=timed, args=(k, f)) for k, f in [("util", util), ("power", power), ("temp", temp)]]
    [x.start() for x in ts]
    timed("mem", mem); timed("procs", procs)
    [x.join() for x in ts]
elif mode == "fields":
    timed("mem", mem); timed("procs", procs)
    ids = [n.NVML_FI_DEV_POWER_INSTANT, n.NVML_FI_DEV_MEMORY_TEMP]
    timed("fields(power,memtemp)", lambda: n.nvmlDeviceGetFieldValues(h, ids))
    timed("util", util); timed("temp", temp); timed("power", power)
log.append("reads total %.2f" % ((t() - g0) * 1e3))
print("%-10s %s" % (mode, ", ".join(log)))
