//! Compiles the guest payloads (C and assembly in `guest/`) into freestanding, PVH-bootable
//! ELF images with the system C compiler, and writes `abi.h` from `src/abi.rs`.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::{env, fs};

/// Every payload: name, one-line description. Each has `guest/<name>.c`.
const PAYLOADS: &[(&str, &str)] = &[
    ("demo", "hello from CPL0 and CPL3, then exit 0 (the default guest)"),
    ("hostile", "random port, MMIO and string I/O of every size; garbage to every device register"),
    ("doorbell", "the doorbell lab's guest: rings a doorbell N times per path (run by `exitless bench doorbell`)"),
    ("hotplug", "takes PCI devices plugged and unplugged through the ACPI hotplug controller's registers"),
    ("pciscan", "enumerates bus 0 by port I/O and ECAM, checks they agree, sizes BARs, times config reads"),
    ("pcihostile", "random config writes of every size at every offset, by port I/O and ECAM; identity must hold"),
    ("nettx", "sends N frames of size S with sequence numbers through virtio-net (run by `exitless bench net`)"),
    ("netecho", "echoes every frame it receives through virtio-net until it has echoed N"),
    ("nethostile", "a virtio-net driver that breaks every rule: bad features, sizes, rings and chains"),
    (
        "blkbench",
        "one block workload at one queue depth through virtio-blk, every block verified (run by `exitless bench blk`)",
    ),
    ("blkhostile", "a virtio-blk driver that sends every malformed request; each must fail and the disk keep working"),
    ("counter", "counts at CPL3 and prints a tick every 2^20 iterations; for snapshots"),
    ("snapwork", "counts, writes a sector per tick to virtio-blk and echoes frames; for snapshots with devices"),
    ("forkmem", "fills RAM with a pattern of its own nonce and checks it each generation; for forked snapshots"),
    ("netpair", "lab frames on two NICs at once, each with its own sequence numbers"),
    ("mmdsget", "an MMDS client: ARP, TCP and HTTP to 169.254.169.254, token, three keys checked byte for byte"),
    ("vsockecho", "a vsock echo server on a port (and optionally a client of the host), every byte within credit"),
    ("vsockflood", "a hostile vsock driver: no receive buffers, its transmit ring full of packets each answered RST"),
    (
        "vmgenid",
        "prints the VMGenID id the DSDT's ADDR names, then each new generation with the PIC's IRR (--params N: wait for N)",
    ),
    ("rngread", "reads entropy from virtio-rng: every buffer filled, no two alike, a read-only buffer refused"),
    (
        "memdma",
        "hostile: virtio-rng DMA across virtio-mem's unplugged region; every chain must be refused, no memory committed",
    ),
    ("crash", "fails on purpose: triple fault (default) or spins forever (--params 2)"),
    (
        "bootcheck",
        "checks the boot protocol's data, e820 map, command line, initrd and ACPI tables (also as a bzImage)",
    ),
    ("smp", "starts every other vCPU with INIT/SIPI; each checks in on the serial port"),
    ("barmove", "one vCPU moves a BAR back and forth while another reads it: no read may miss the device"),
    ("wait", "says it is running, then halts until the VMM stops it (an idle microVM for the API and fleet)"),
    ("cpuid", "prints its CPUID leaves (features, signature, brand): what a CPU template left the guest"),
    ("s3wake", "reads the CMOS RTC, sleeps in ACPI S3 and wakes by its alarm (with --testdevs); exits with PM1 status"),
];

/// 32-bit multiboot payloads (what kvm-unit-tests' flat files look like): name, one line.
/// Each is `guest/multiboot/<name>.c` with `start.S`, linked at 4 MiB.
const MULTIBOOT: &[(&str, &str)] =
    &[("mbcheck", "a 32-bit multiboot guest: checks the multiboot info and QEMU's test devices (--testdevs)")];

/// Payloads also built as a bzImage (Linux boot protocol 2.12, 64-bit entry).
const BZIMAGES: &[&str] = &["bootcheck"];

const RUNTIME: &[&str] = &["entry.S", "runtime.c", "virtio.c", "acpi.c", "smp.S"];

fn main() {
    let out = PathBuf::from(env::var("OUT_DIR").expect("OUT_DIR"));
    let guest = Path::new("guest");
    println!("cargo:rerun-if-changed=guest");
    println!("cargo:rerun-if-changed=src/abi.rs");

    let abi = fs::read_to_string("src/abi.rs").expect("abi.rs");
    fs::write(out.join("abi.h"), abi_header(&abi, "#define {} {}ULL\n")).expect("write abi.h");
    fs::write(out.join("abi.inc"), abi_header(&abi, "\t.set {}, {}\n")).expect("write abi.inc");

    let cc = env::var("CC").unwrap_or_else(|_| "cc".into());
    let cflags = [
        "-m64",
        "-O2",
        "-ffreestanding",
        "-fno-pic",
        "-fno-pie",
        "-fno-stack-protector",
        "-mno-red-zone",
        "-mno-sse",
        "-mno-mmx",
        "-mno-avx",
        "-mgeneral-regs-only",
        "-fno-asynchronous-unwind-tables",
        "-fcf-protection=none",
        "-nostdlib",
        "-static",
        "-no-pie",
        "-Wall",
        "-Wextra",
        "-Werror",
        "-Wl,--build-id=none",
        "-Wl,-z,noexecstack",
    ];
    let mut table = String::from("pub static PAYLOADS: &[Payload] = &[\n");
    let mut blobs = Blobs::default();
    for (name, about) in PAYLOADS {
        let elf = out.join(format!("{name}.elf"));
        let mut cmd = Command::new(&cc);
        cmd.args(cflags)
            .arg("-I")
            .arg(&out)
            .arg("-I")
            .arg(guest.join("runtime"))
            .arg("-T")
            .arg(guest.join("runtime/linker.ld"))
            .arg("-o")
            .arg(&elf);
        for src in RUNTIME {
            cmd.arg(guest.join("runtime").join(src));
        }
        cmd.arg(guest.join(format!("{name}.c")));
        let status = cmd.status().unwrap_or_else(|e| panic!("cannot run {cc}: {e}"));
        assert!(status.success(), "compiling guest payload {name} failed: {cmd:?}");
        let bzimage = if BZIMAGES.contains(name) {
            let path = out.join(format!("{name}.bzImage"));
            fs::write(&path, bzimage(&elf, &out)).expect("write bzImage");
            format!("Some({})", blobs.embed(&path))
        } else {
            "None".into()
        };
        table.push_str(&format!(
            "    Payload {{ name: {name:?}, about: {about:?}, elf: {}, bzimage: {bzimage}, multiboot: false }},\n",
            blobs.embed(&elf)
        ));
    }
    for (name, about) in MULTIBOOT {
        let elf = out.join(format!("{name}.elf"));
        let dir = guest.join("multiboot");
        let mut cmd = Command::new(&cc);
        cmd.args(["-m32", "-O2", "-ffreestanding", "-fno-pic", "-fno-pie", "-fno-stack-protector"])
            .args(["-mgeneral-regs-only", "-fno-asynchronous-unwind-tables", "-fcf-protection=none"])
            .args(["-nostdlib", "-static", "-no-pie", "-Wall", "-Wextra", "-Werror", "-Wl,--build-id=none"])
            .arg("-I")
            .arg(&out)
            .arg("-T")
            .arg(dir.join("mb.ld"))
            .arg("-o")
            .arg(&elf)
            .arg(dir.join("start.S"))
            .arg(dir.join(format!("{name}.c")));
        let status = cmd.status().unwrap_or_else(|e| panic!("cannot run {cc}: {e}"));
        assert!(status.success(), "compiling multiboot payload {name} failed (does {cc} take -m32?): {cmd:?}");
        table.push_str(&format!(
            "    Payload {{ name: {name:?}, about: {about:?}, elf: {}, bzimage: None, multiboot: true }},\n",
            blobs.embed(&elf)
        ));
    }
    table.push_str("];\n");
    table.push_str(&blobs.statics);
    fs::write(out.join("payloads.rs"), table).expect("write payloads.rs");
}

/// The images as statics in a section of their own: 2 MB of guest code a VMM reads only
/// when it boots one, kept out of `.rodata`, where the kernel's fault-around would map
/// them beside the strings and tables every start touches (resident memory).
#[derive(Default)]
struct Blobs {
    statics: String,
    count: usize,
}

impl Blobs {
    /// Embeds the file at `path`; the expression that names it.
    fn embed(&mut self, path: &Path) -> String {
        let len = fs::metadata(path).unwrap_or_else(|e| panic!("{}: {e}", path.display())).len();
        let name = format!("BLOB_{}", self.count);
        self.count += 1;
        self.statics.push_str(&format!(
            "#[link_section = \".exitless_payloads\"]\nstatic {name}: [u8; {len}] = *include_bytes!({:?});\n",
            path.display().to_string()
        ));
        format!("&{name}")
    }
}

/// Wraps the payload's loaded bytes (linked at 1 MiB, the 64-bit Linux entry 0x200 in) in a
/// bzImage: a boot sector and one setup sector holding the setup header, then the image.
fn bzimage(elf: &Path, out: &Path) -> Vec<u8> {
    let objcopy = env::var("OBJCOPY").unwrap_or_else(|_| "objcopy".into());
    let flat = out.join(elf.file_stem().expect("name")).with_extension("bin");
    let status = Command::new(&objcopy)
        .args(["-O", "binary", "--only-section=.text", "--only-section=.rodata", "--only-section=.data"])
        .arg(elf)
        .arg(&flat)
        .status()
        .unwrap_or_else(|e| panic!("cannot run {objcopy}: {e}"));
    assert!(status.success(), "objcopy {} failed", elf.display());
    let body = fs::read(&flat).expect("read flat image");
    let mut image = vec![0u8; 1024];
    let put = |image: &mut Vec<u8>, at: usize, bytes: &[u8]| image[at..at + bytes.len()].copy_from_slice(bytes);
    image[0x1f1] = 1; // setup_sects: one sector after the boot sector
    put(&mut image, 0x1fe, &0xaa55u16.to_le_bytes());
    put(&mut image, 0x202, b"HdrS");
    put(&mut image, 0x206, &0x020cu16.to_le_bytes()); // boot protocol 2.12
    image[0x211] = 1; // loadflags: LOADED_HIGH
    put(&mut image, 0x214, &0x10_0000u32.to_le_bytes()); // code32_start
    put(&mut image, 0x22c, &0x7fff_ffffu32.to_le_bytes()); // initrd_addr_max
    put(&mut image, 0x230, &0x20_0000u32.to_le_bytes()); // kernel_alignment
    put(&mut image, 0x236, &1u16.to_le_bytes()); // xloadflags: XLF_KERNEL_64
    put(&mut image, 0x238, &2047u32.to_le_bytes()); // cmdline_size
    put(&mut image, 0x260, &(body.len() as u32 + (1 << 20)).to_le_bytes()); // init_size
    image.extend_from_slice(&body);
    image
}

/// `pub const NAME: T = VALUE;` lines become `format` with NAME and VALUE (underscores in
/// numbers dropped): `#define`s for C, `.set`s for assembly.
fn abi_header(rust: &str, format: &str) -> String {
    let mut h = String::from("/* Generated by build.rs from src/abi.rs. Do not edit. */\n");
    if format.starts_with('#') {
        h.push_str("#pragma once\n");
    }
    for line in rust.lines() {
        let Some(rest) = line.trim().strip_prefix("pub const ") else { continue };
        let (name, rest) = rest.split_once(':').expect("const NAME: T = V;");
        let value = rest.split_once('=').expect("= VALUE").1.trim().trim_end_matches(';').replace('_', "");
        h.push_str(&format.replacen("{}", name.trim(), 1).replacen("{}", &value, 1));
    }
    h
}
