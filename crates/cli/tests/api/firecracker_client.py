"""Drives exitless through the unmodified PyPI client `firecracker-python` 0.0.5
(`firecracker.api.Api`), as Firecracker tooling would: configure, start, check the guest's
serial output and exit, and every bad request gets a 400 with a fault_message while the
VMM keeps serving. Usage: firecracker_client.py EXITLESS PAYLOAD_DIR WORK_DIR"""
import atexit
import json
import os
import subprocess
import sys
import time

from firecracker.api import Api
from firecracker.exceptions import APIError

exitless, payloads, work = sys.argv[1:4]
failures = []
started = []
# A check that raises must not leave VMMs behind.
atexit.register(lambda: [p.kill() for p in started if p.poll() is None])


def check(cond, what):
    print(("ok   " if cond else "FAIL ") + what, flush=True)
    if not cond:
        failures.append(what)


def until(cond, seconds=30.0):
    """Polls `cond` until it holds or `seconds` pass (a loaded host may be slow); its last value."""
    deadline = time.monotonic() + seconds
    while not cond() and time.monotonic() < deadline:
        time.sleep(0.01)
    return cond()


def start_vmm(name):
    sock = os.path.join(work, name + ".sock")
    if os.path.exists(sock):
        os.unlink(sock)
    proc = subprocess.Popen([exitless, "--api-sock", sock, "--id", name],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL)
    started.append(proc)
    until(lambda: os.path.exists(sock))
    return proc, sock, Api(sock)


def boot_wait_guest(api, vcpus, **boot_args):
    """Configures and starts the `wait` payload (boot_args: its command line, if any)."""
    api.machine_config.put(vcpu_count=vcpus, mem_size_mib=64)
    api.boot.put(kernel_image_path=os.path.join(payloads, "wait.elf"), **boot_args)
    api.actions.put(action_type="InstanceStart")


def kill_vmm(proc, sock):
    proc.kill()
    proc.wait()
    os.path.exists(sock) and os.unlink(sock)


def refused(what, call, expect=None):
    """The call must fail with a fault_message (naming `expect` if given)."""
    try:
        call()
    except APIError as e:
        text = str(e)
        check("API fault:" in text and (expect is None or expect in text), f"{what}: 400 ({text[:110]})")
        return
    check(False, f"{what}: was accepted")


def raw(api, method, path, data):
    """A request the client would never build (broken JSON, huge bodies)."""
    r = api.session.request(method, api.endpoint + path, data=data,
                            headers={"Content-Type": "application/json"})
    return r.status_code, r.json() if r.content else None


# 1. Configure and boot the demo guest; it prints and exits 0, and so does the VMM.
proc, sock, api = start_vmm("fc-demo")
info = api.describe.get().json()
check(info["app_name"] == "exitless" and info["id"] == "fc-demo" and info["state"] == "Not started",
      f"GET / describes the instance: {info}")
check("firecracker_version" in api.version.get().json(), "GET /version")
api.machine_config.put(vcpu_count=1, mem_size_mib=64)
check(api.machine_config.get().json()["mem_size_mib"] == 64, "PUT then GET /machine-config")
api.boot.put(kernel_image_path=os.path.join(payloads, "demo.elf"), boot_args="console=ttyS0")

# 2. Bad requests, each a 400 with a fault_message; the VMM keeps serving after each.
refused("unknown field", lambda: api.machine_config.put(vcpu_count=1, mem_size_mib=64, turbo=True), "unknown field")
refused("wrong type", lambda: api.machine_config.put(vcpu_count="two", mem_size_mib=64), "invalid type")
refused("zero vCPUs", lambda: api.machine_config.put(vcpu_count=0, mem_size_mib=64), "vCPU")
refused("missing kernel", lambda: api.boot.put(kernel_image_path="/nonexistent/vmlinux"), "kernel")
refused("drive id with '/'", lambda: api.drive.put(drive_id="a/b", path_on_host="/dev/null", is_root_device=False,
                                                  is_read_only=True))
refused("drive id '..'", lambda: api.drive.put(drive_id="..", path_on_host="/dev/null", is_root_device=False,
                                              is_read_only=True))
refused("body and path ids differ", lambda: api.drive.request("PUT", "/drives/one", drive_id="two",
                                                               path_on_host="/dev/null", is_root_device=False))
# Any CID, as Firecracker's VsockDeviceConfig (no check); a socket path is needed.
refused("vsock without a socket path", lambda: api.vsock.put(guest_cid=2, uds_path=""), "uds_path")
refused("snapshot before the start", lambda: api.create_snapshot.put(snapshot_path="/tmp/s", mem_file_path="/tmp/m"), "not running")
api.mmds.put(latest={"meta-data": {"instance-id": "i-py"}})
check(api.mmds.get().json() == {"latest": {"meta-data": {"instance-id": "i-py"}}}, "PUT then GET /mmds")
refused("MMDS on a NIC that does not exist", lambda: api.mmds_config.put(network_interfaces=["eth7"]), "eth7")
status, body = raw(api, "PUT", "/machine-config", "{not json")
check(status == 400 and "fault_message" in body, f"malformed JSON: {status} {body}")
status, body = raw(api, "PUT", "/boot-source", json.dumps({"kernel_image_path": "x" * 60000}))
check(status == 400 and "larger than" in body["fault_message"], f"oversized body: {status} {str(body)[:90]}")
status, body = raw(api, "DELETE", "/machine-config", "")
check(status == 400 and "fault_message" in body, f"unknown method: {status} {body}")
check(api.describe.get().json()["state"] == "Not started", "still serving after every bad request")

api.actions.put(action_type="InstanceStart")
out, err = proc.communicate(timeout=60)
out = out.decode(errors="replace")
check("hello from CPL0" in out and "goodbye" in out, "the guest's serial output is on stdout")
check(proc.returncode == 0, f"the VMM exits with the guest (status {proc.returncode})")
check(not os.path.exists(sock), "the socket is removed when the VMM exits")

# 3. A guest that keeps running: pre-boot changes and a second start are refused, and the
#    live exit profile is there.
proc, sock, api = start_vmm("fc-wait")
boot_wait_guest(api, 2)
check(api.describe.get().json()["state"] == "Running", "GET / says Running after InstanceStart")
refused("pre-boot resource after start", lambda: api.machine_config.put(vcpu_count=1, mem_size_mib=64), "after starting")
refused("boot source after start", lambda: api.boot.put(kernel_image_path=os.path.join(payloads, "demo.elf")),
        "after starting")
refused("second InstanceStart", lambda: api.actions.put(action_type="InstanceStart"), "once")
# The guest prints its line (one string-I/O exit to the serial port) before it halts.
serial_writes = lambda: api.session.get(api.endpoint + "/exits").json()["devices"]["serial"]["writes"]
until(lambda: serial_writes() >= 1)
r = api.session.get(api.endpoint + "/exits")
profile = r.json()
check(r.status_code == 200 and profile["state"] == "Running" and len(profile["vcpus"]) == 2
      and profile["devices"]["serial"]["writes"] >= 1 and "vmm_ns_per_exit_median" in profile,
      f"GET /exits: the live profile ({json.dumps(profile)[:160]})")
config = api.vm_config.get().json()
check(config["machine-config"]["vcpu_count"] == 2 and config["boot-source"]["kernel_image_path"].endswith("wait.elf"),
      "GET /vm/config")
top = subprocess.run([exitless, "top", "--api-sock", sock, "--iterations", "1", "--interval", "0.2"],
                     capture_output=True, text=True, timeout=30)
check(top.returncode == 0 and "exitless top: Running (2 vCPUs" in top.stdout and "serial writes" in top.stdout,
      f"exitless top shows the live view: {top.stdout[:120]!r}")
kill_vmm(proc, sock)

# 4. Pause and resume a guest that spins at CPL3 with no exits: while paused its vCPU
#    thread gets no CPU time at all; running, it gets some (how much is the host's to say).
def vcpu_cpu_seconds(pid):
    for tid in os.listdir(f"/proc/{pid}/task"):
        with open(f"/proc/{pid}/task/{tid}/comm") as f:
            if f.read().strip() == "vcpu0":
                with open(f"/proc/{pid}/task/{tid}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
                return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return None


def cpu_over(pid, seconds):
    before = vcpu_cpu_seconds(pid)
    time.sleep(seconds)
    return vcpu_cpu_seconds(pid) - before


def cpu_gained(pid):
    """vcpu0's CPU time that accrues from now, once any does (or 30 s pass)."""
    before = vcpu_cpu_seconds(pid) or 0.0
    until(lambda: (vcpu_cpu_seconds(pid) or 0.0) > before)
    return (vcpu_cpu_seconds(pid) or 0.0) - before


proc, sock, api = start_vmm("fc-pause")
refused("pause before start", lambda: api.vm.patch(state="Paused"), "only a running one")
boot_wait_guest(api, 1, boot_args="spin")
until(lambda: vcpu_cpu_seconds(proc.pid) is not None)
running = cpu_gained(proc.pid)
api.vm.patch(state="Paused")
check(api.describe.get().json()["state"] == "Paused", "GET / says Paused after PATCH /vm Paused")
paused = cpu_over(proc.pid, 1.0)
api.vm.patch(state="Resumed")
check(api.describe.get().json()["state"] == "Running", "GET / says Running after PATCH /vm Resumed")
resumed = cpu_gained(proc.pid)
check(running > 0 and paused <= 0.02 and resumed > 0,
      f"a paused vCPU gets no CPU (vcpu0 CPU s: running {running:.2f}, paused {paused:.2f} in 1 s, resumed {resumed:.2f})")
refused("an unknown state", lambda: api.vm.patch(state="Frozen"), "unknown variant")
kill_vmm(proc, sock)

# 5. SendCtrlAltDel: the keys reach the guest's PS/2 keyboard with IRQ 1; this guest, like
#    Linux, resets on them, and the VMM exits with it.
proc, sock, api = start_vmm("fc-cad")
refused("SendCtrlAltDel before start", lambda: api.actions.put(action_type="SendCtrlAltDel"), "running one")
boot_wait_guest(api, 1, boot_args="kbd")
time.sleep(0.5)
api.actions.put(action_type="SendCtrlAltDel")
out, err = proc.communicate(timeout=60)
out = out.decode(errors="replace")
check("wait: ctrl-alt-del; resetting" in out and proc.returncode == 0 and "guest reset" in err.decode(errors="replace"),
      f"SendCtrlAltDel resets a guest that reads its keyboard (status {proc.returncode}, {out.strip()[-40:]!r})")

top = subprocess.run([exitless, "top", "--api-sock", sock], capture_output=True, text=True, timeout=30)
check(top.returncode != 0 and len(top.stderr.strip().splitlines()) == 1 and "cannot reach" in top.stderr,
      f"exitless top on a gone socket: one line ({top.stderr.strip()!r})")

print(f"{len(failures)} failed" if failures else "all checks passed", flush=True)
sys.exit(1 if failures else 0)
