#!/usr/bin/env python3
"""Writes an uncompressed newc cpio (no decompression at emulated CPL0) holding busybox and
an /init, with the directories a busybox init mounts on.
Usage: make-initramfs.py OUT BUSYBOX INIT [NAME=FILE ...] (more executables, e.g. bin/x=x)"""
import sys

out, busybox, init = sys.argv[1:4]
entries = [("dev", 0o040755, b""), ("bin", 0o040755, b""), ("proc", 0o040755, b""), ("sys", 0o040755, b""),
           ("tmp", 0o041777, b""), ("bin/busybox", 0o100755, open(busybox, "rb").read()),
           ("init", 0o100755, open(init, "rb").read())]
entries += [(name, 0o100755, open(path, "rb").read()) for name, path in (a.split("=", 1) for a in sys.argv[4:])]


def record(ino, name, mode, data):
    name_b = name.encode() + b"\0"
    fields = (ino, mode, 0, 0, 1, 0, len(data), 0, 0, 0, 0, len(name_b), 0)
    b = ("070701" + "".join(f"{v:08x}" for v in fields)).encode() + name_b
    b += b"\0" * (-len(b) % 4) + data
    return b + b"\0" * (-len(b) % 4)


blob = b"".join(record(i + 1, *e) for i, e in enumerate(entries)) + record(0, "TRAILER!!!", 0, b"")
open(out, "wb").write(blob + b"\0" * (-len(blob) % 512))
