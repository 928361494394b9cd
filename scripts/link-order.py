#!/usr/bin/env python3
"""Writes resources/link/exitless.order: the functions a VMM runs from its spawn to a running
guest, booted or loaded from a snapshot (a fleet's clones), in the order the linker should lay them out (crates/cli/build.rs passes the file to
rust-lld). The kernel maps a binary's text 64 KiB around every page a process touches, so
start-up code spread over the 3 MiB of text costs every VMM of a fleet resident memory it
never runs; laid out together it costs the pages it runs (docs/benchmarks.md, issue #54).

    sudo scripts/link-order.py            (root: a loop device; needs valgrind, python3)

Two views of the same two starts, both driven through the API the way `bench peers`,
`bench fork` and Firecracker's clients do it (PUT /machine-config, /boot-source, /actions
InstanceStart; then, from a snapshot of that guest, PUT /snapshot/load and the guest asked
once by SendCtrlAltDel; the `wait` payload):
  1. valgrind's callgrind: every instruction run, so every function run, exactly; but under
     valgrind the VMM runs without seccomp and Landlock (valgrind knows neither call);
  2. the real start, from a copy of the binary on a loop device whose readahead is off, its
     page cache empty: afterwards the cache holds exactly the pages the VMM read; the
     functions on those text pages that (1) did not name are added after (1)'s.
Rust's symbol names carry a hash of the crate's build configuration, so both builds a user
makes are profiled: the README's (`cargo run --release`: the exitless package alone) and
the workspace's (`cargo build --release`, where the labs' feature reaches the VMM crate).
The names a new toolchain no longer makes are skipped by the linker; crates/cli/tests/
link_order.rs fails when too many are gone, and this script makes the file again.
"""
import bisect
import http.client
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BIN = os.path.join(ROOT, "target/x86_64-unknown-linux-gnu/release/exitless")
ORDER = os.path.join(ROOT, "resources/link/exitless.order")
BUILDS = {
    "readme": ["cargo", "build", "--release", "-p", "exitless", "--bin", "exitless"],
    "workspace": ["cargo", "build", "--release", "--workspace"],
}


class UnixHTTP(http.client.HTTPConnection):
    def __init__(self, path):
        super().__init__("localhost")
        self.path = path

    def connect(self):
        # The socket file appears at bind, a moment before the VMM listens.
        for _ in range(500):
            self.sock = socket.socket(socket.AF_UNIX)
            try:
                return self.sock.connect(self.path)
            except ConnectionRefusedError:
                self.sock.close()
                time.sleep(0.01)
        sys.exit(f"link-order: nothing listens on {self.path}")


def put(sock, path, body, method="PUT"):
    conn = UnixHTTP(sock)
    conn.request(method, path, body, {"Content-Type": "application/json"})
    reply = conn.getresponse()
    text = reply.read()
    if reply.status >= 300:
        sys.exit(f"link-order: {method} {path}: {reply.status} {text!r}")


BOOT = '{"kernel_image_path": "%s", "boot_args": "console=ttyS0 kbd echo"}'
SNAPSHOT = ("snap.state", "snap.mem")


def boot(sock, work, console):
    put(sock, "/machine-config", '{"vcpu_count": 1, "mem_size_mib": 128}')
    put(sock, "/boot-source", BOOT % os.path.join(work, "payloads/wait.elf"))
    put(sock, "/actions", '{"action_type": "InstanceStart"}')
    return b"wait: running"


def load(sock, work, console):
    state, memory = (os.path.join(work, f) for f in SNAPSHOT)
    put(sock, "/snapshot/load", '{"snapshot_path": "%s", "mem_backend": {"backend_type": "File", '
        '"backend_path": "%s"}, "resume_vm": true}' % (state, memory))
    put(sock, "/actions", '{"action_type": "SendCtrlAltDel"}')
    return b"wait: ctrl-alt-del 1"


def snapshot(binary, work, wrapper=(), flags=()):
    """A snapshot of the booted `wait` guest by `binary`, for `load` to start from (under
    the same wrapper as the load: valgrind's CPUID is not the host's, and a snapshot
    loads only on the CPU it was taken on)."""
    def take(sock, work, console):
        boot(sock, work, console)
        while b"wait: running" not in open(console, "rb").read():
            time.sleep(0.01)
        put(sock, "/vm", '{"state": "Paused"}', "PATCH")
        state, memory = (os.path.join(work, f) for f in SNAPSHOT)
        put(sock, "/snapshot/create", '{"snapshot_type": "Full", "snapshot_path": "%s", "mem_file_path": "%s"}'
            % (state, memory))
        return b""
    start(binary, work, wrapper, flags, scenario=take)


def start(binary, work, wrapper=(), flags=(), scenario=boot):
    """Starts `binary` as `bench peers` does, runs `scenario` through its API and returns
    once its guest printed the line the scenario waits for, then ends it."""
    sock = os.path.join(work, "api.sock")
    console = os.path.join(work, "console.txt")
    if os.path.exists(sock):
        os.unlink(sock)
    with open(console, "wb") as out, open(os.path.join(work, "stderr.txt"), "wb") as err:
        proc = subprocess.Popen([*wrapper, binary, "--api-sock", sock, *flags], stdout=out, stderr=err)
    try:
        deadline = time.time() + 300
        while not os.path.exists(sock):
            if time.time() > deadline or proc.poll() is not None:
                sys.exit(f"link-order: {binary} served no API (see {work}/stderr.txt)")
            time.sleep(0.01)
        line = scenario(sock, work, console)
        while line not in open(console, "rb").read():
            if time.time() > deadline or proc.poll() is not None:
                sys.exit(f"link-order: the guest did not start (see {work})")
            time.sleep(0.01)
        time.sleep(0.5)
    finally:
        proc.terminate()
        proc.wait()


def functions(binary):
    """(start, size, name) of every function, sorted by address."""
    out = subprocess.run(["nm", "-n", "--defined-only", "-S", binary], capture_output=True, text=True, check=True)
    syms = []
    for line in out.stdout.splitlines():
        f = line.split()
        if len(f) == 4 and f[2] in "tTwW":
            syms.append((int(f[0], 16), int(f[1], 16), f[3]))
    return syms


def containing(syms, starts, lo, hi):
    """Names of the functions overlapping [lo, hi)."""
    i = max(bisect.bisect_right(starts, lo) - 1, 0)
    names = []
    while i < len(syms) and syms[i][0] < hi:
        if syms[i][0] + max(syms[i][1], 1) > lo:
            names.append(syms[i][2])
        i += 1
    return names


def callgrind_functions(binary, work):
    """The functions a boot runs, in the order of their addresses, then those a load adds."""
    names = []
    snapshot(binary, work, ["valgrind", "--tool=none"], ["--no-seccomp"])
    for scenario in (boot, load):
        out = os.path.join(work, f"callgrind-{scenario.__name__}.out")
        wrapper = ["valgrind", "--tool=callgrind", "--dump-instr=yes", f"--callgrind-out-file={out}"]
        start(binary, work, wrapper, ["--no-seccomp"], scenario)
        names += callgrind_out(binary, out)
    return list(dict.fromkeys(names))


def callgrind_out(binary, out):
    addrs, last = set(), 0
    for line in open(out):
        tok = line.split(" ", 1)[0].rstrip("\n")
        if tok.startswith("0x"):
            last = int(tok, 16)
        elif tok.startswith("+") and tok[1:].isdigit():
            last += int(tok[1:])
        elif tok.startswith("-") and tok[1:].isdigit():
            last -= int(tok[1:])
        elif tok != "*":
            continue
        addrs.add(last)
    syms = functions(binary)
    starts = [s[0] for s in syms]
    run = {}
    for a in addrs:
        for name in containing(syms, starts, a, a + 1):
            run[name] = a
    return [n for n, _ in sorted(run.items(), key=lambda kv: kv[1])]


def text_segment(binary):
    out = subprocess.run(["readelf", "-lW", binary], capture_output=True, text=True, check=True).stdout
    for line in out.splitlines():
        f = line.split()
        if f and f[0] == "LOAD" and "E" in f[6:-1]:
            return int(f[1], 16), int(f[2], 16), int(f[4], 16)
    sys.exit("link-order: no executable segment")


def traced_functions(binary, work):
    """Functions on the text pages a real start reads, from a cold cache without readahead."""
    image = os.path.join(work, f"ra-{os.path.basename(binary)}.img")
    mnt = os.path.join(work, "ra")
    subprocess.run(["truncate", "-s", "96M", image], check=True)
    subprocess.run(["mkfs.ext4", "-q", "-F", image], check=True)
    loop = subprocess.run(["losetup", "-f", "--show", image], capture_output=True, text=True, check=True).stdout.strip()
    os.makedirs(mnt, exist_ok=True)
    try:
        subprocess.run(["blockdev", "--setra", "0", loop], check=True)
        subprocess.run(["mount", loop, mnt], check=True)
        shutil.copy(binary, os.path.join(mnt, "exitless"))
        subprocess.run(["umount", mnt], check=True)  # empties its page cache
        subprocess.run(["mount", loop, mnt], check=True)
        copy = os.path.join(mnt, "exitless")
        snapshot(copy, work)  # a snapshot by the binary that loads it
        subprocess.run(["umount", mnt], check=True)
        subprocess.run(["mount", loop, mnt], check=True)
        start(copy, work)
        start(copy, work, scenario=load)
        pages = resident_pages(copy)
    finally:
        subprocess.run(["umount", mnt], stderr=subprocess.DEVNULL)
        subprocess.run(["losetup", "-d", loop], stderr=subprocess.DEVNULL)
    offset, vaddr, size = text_segment(binary)
    syms = functions(binary)
    starts = [s[0] for s in syms]
    names = []
    for page in pages:
        lo = max(page * 4096, offset)
        hi = min(page * 4096 + 4096, offset + size)
        if lo < hi:
            names += containing(syms, starts, lo - offset + vaddr, hi - offset + vaddr)
    return names, len(pages)


def resident_pages(path):
    import ctypes
    import mmap

    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    size = os.path.getsize(path)
    with open(path, "rb") as f:
        addr = libc.mmap(None, ctypes.c_size_t(size), mmap.PROT_READ, mmap.MAP_SHARED, f.fileno(), ctypes.c_long(0))
        count = (size + 4095) // 4096
        vec = (ctypes.c_ubyte * count)()
        failed = libc.mincore(ctypes.c_void_p(addr), ctypes.c_size_t(size), vec) != 0
        errno = ctypes.get_errno()
        libc.munmap(ctypes.c_void_p(addr), ctypes.c_size_t(size))
        if failed:
            sys.exit(f"link-order: mincore: errno {errno}")
    return [i for i in range(count) if vec[i] & 1]


def write(order):
    with open(ORDER, "w") as f:
        f.write("# Made by scripts/link-order.py: the functions a VMM runs from its spawn to a running\n")
        f.write("# guest, booted or loaded, laid out together by rust-lld (crates/cli/build.rs). Do not edit by hand.\n")
        f.write("\n".join(order) + "\n")


def build(name, work):
    """Builds one way and returns a copy of its binary (the next build replaces the original)."""
    subprocess.run(BUILDS[name], cwd=ROOT, check=True)
    binary = os.path.join(work, f"exitless-{name}")
    shutil.copy(BIN, binary)
    return binary


def main():
    if os.geteuid() != 0:
        sys.exit("link-order: needs root (a loop device)")
    work = tempfile.mkdtemp(prefix="exitless-link-order-")
    ran = {}
    for name in BUILDS:
        binary = build(name, work)
        subprocess.run([binary, "payloads", "--out", os.path.join(work, "payloads")], stdout=subprocess.DEVNULL, check=True)
        ran[name] = callgrind_functions(binary, work)
        print(f"link-order: {name}: {len(ran[name])} functions run under valgrind")
    order = list(dict.fromkeys(n for names in ran.values() for n in names))
    # Linked with valgrind's functions first, a real start's pages beyond them are the
    # functions valgrind could not see (seccomp, Landlock), each page with its neighbours.
    write(order)
    for name in BUILDS:
        traced, pages = traced_functions(build(name, work), work)
        extra = list(dict.fromkeys(n for n in traced if n not in set(order)))
        print(f"link-order: {name}: a real start read {pages} pages; {len(extra)} functions on them are added")
        order += extra
    write(order)
    print(f"link-order: {len(order)} names written to {os.path.relpath(ORDER, ROOT)}")
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
