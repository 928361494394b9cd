#!/usr/bin/env python3
"""The vsock flood guest (issue 53): a guest that posts no RX buffers and floods packets
each answered with RST, run for SECONDS while the VMM's resident memory is sampled (at
1 s, then every 5 s). Prints each sample and the growth after the first second, which
must stay within 1 MiB.

    scripts/vsock-flood-rss.py [EXITLESS] [SECONDS]   (default: the release build, 60)
"""
import os, subprocess, sys, tempfile, threading, time

here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
exe = sys.argv[1] if len(sys.argv) > 1 else os.path.join(here, "target/x86_64-unknown-linux-gnu/release/exitless")
secs = int(sys.argv[2]) if len(sys.argv) > 2 else 60
work = tempfile.mkdtemp(prefix="vsock-flood-")
vmm = subprocess.Popen(
    [exe, "run", "--payload", "vsockflood", "--vsock", f"cid=3,uds={work}/v.sock", "--params", "0",
     "--timeout", str(secs + 30)],
    stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
last = [""]
for line in vmm.stdout:
    if "flooding" in line:
        break
else:
    sys.exit("vsock-flood: the guest never started flooding")

def read():
    for line in vmm.stdout:
        last[0] = line.strip()

threading.Thread(target=read, daemon=True).start()

def rss_kib():
    with open(f"/proc/{vmm.pid}/status") as status:
        return next(int(l.split()[1]) for l in status if l.startswith("VmRSS:"))

start, samples = time.time(), []
for t in [1] + list(range(5, secs + 1, 5)):
    time.sleep(max(0.0, start + t - time.time()))
    samples.append(rss_kib())
    print(f"t={t:3d}s VmRSS={samples[-1]} KiB  ({last[0]})", flush=True)
vmm.kill()
vmm.wait()
growth = max(samples) - samples[0]
print(f"vsock-flood: growth after the first second {growth} KiB over {secs} s: {'PASS' if growth <= 1024 else 'FAIL'}")
sys.exit(0 if growth <= 1024 else 1)
