/* Checks what a multiboot loader with QEMU's test devices hands a kvm-unit-tests guest:
 * the boot magic, the information structure (memory sizes, memory map against the RAM
 * size, command line, the initrd as the one module), fw_cfg (signature, RAM size, CPU
 * count), pc-testdev's scratch register, pci-testdev's test headers, and the state a BIOS
 * leaves (real-mode vectors, PIC masks, the PIT ticking). Parameters (the
 * shared page, as for every payload): RAM size, vCPUs, initrd size, initrd byte sum.
 * Exits 0 when every check holds. 32-bit protected mode, paging off. */
#include "abi.h"

typedef unsigned char u8;
typedef unsigned short u16;
typedef unsigned int u32;
typedef unsigned long long u64;

static inline void outb(u16 p, u8 v) { __asm__ volatile("outb %0, %1" ::"a"(v), "Nd"(p)); }
static inline void outw(u16 p, u16 v) { __asm__ volatile("outw %0, %1" ::"a"(v), "Nd"(p)); }
static inline void outl(u16 p, u32 v) { __asm__ volatile("outl %0, %1" ::"a"(v), "Nd"(p)); }
static inline u8 inb(u16 p) { u8 v; __asm__ volatile("inb %1, %0" : "=a"(v) : "Nd"(p)); return v; }
static inline u16 inw(u16 p) { u16 v; __asm__ volatile("inw %1, %0" : "=a"(v) : "Nd"(p)); return v; }
static inline u32 inl(u16 p) { u32 v; __asm__ volatile("inl %1, %0" : "=a"(v) : "Nd"(p)); return v; }

static void putc(char c) {
	while (!(inb(SERIAL_PORT + 5) & 0x20)) {}
	outb(SERIAL_PORT, (u8)c);
}
static void puts(const char *s) { while (*s) putc(*s++); }
static void putx(u64 v) {
	char buf[17];
	int i = 16;
	buf[i] = 0;
	do { buf[--i] = "0123456789abcdef"[v & 15]; v >>= 4; } while (v && i);
	puts("0x");
	puts(buf + i);
}

/* A load the compiler cannot see through: the vector table starts at address 0. */
static u32 peek32(u32 addr) {
	u32 v;
	__asm__ volatile("movl (%1), %0" : "=r"(v) : "r"(addr));
	return v;
}

static int failures;
static void check(int ok, const char *what) {
	puts(ok ? "mbcheck: ok   " : "mbcheck: FAIL ");
	puts(what);
	putc('\n');
	if (!ok) failures++;
}

struct mb_info {
	u32 flags, mem_lower, mem_upper, boot_device, cmdline, mods_count, mods_addr, syms[4], mmap_length, mmap_addr;
};
struct mb_module { u32 start, end, string, reserved; };
struct mb_mmap { u32 size; u64 addr, len; u32 type; } __attribute__((packed));

static u64 param(u32 i) {
	volatile u64 *shared = (volatile u64 *)(u32)SHARED_PAGE_GPA;
	return shared[0] == SHARED_MAGIC ? shared[SHARED_PARAM_SLOT + i] : 0;
}

static u64 fw_cfg(u16 key, int bytes) {
	u64 v = 0;
	outw(0x510, key);
	for (int i = 0; i < bytes; i++) v |= (u64)inb(0x511) << (8 * i);
	return v;
}

static u32 cf8(u32 fn, u32 reg) {
	outl(0xcf8, 0x80000000u | fn << 8 | reg);
	return inl(0xcfc);
}

/* pci-testdev: finds it, then selects test 0 of its I/O BAR and reads the header's name. */
static int pci_testdev_ok(void) {
	for (u32 fn = 0; fn < 256; fn++) {
		if (cf8(fn, 0) != 0x00051b36) continue;
		outl(0xcf8, 0x80000000u | fn << 8 | 2); /* the device ID through 0xCF8's low bits */
		if (inw(0xcfc) != 0x0005) return 0;
		u16 io = (u16)(cf8(fn, 0x14) & ~3u);
		outb(io, 0);
		const char *want = "portio-no-eventfd";
		for (u32 i = 0; want[i]; i++)
			if (inb((u16)(io + 16 + i)) != (u8)want[i]) return 0;
		u32 offset = inl((u16)(io + 4));
		outb((u16)(io + offset), 0xfa);
		return offset == 128 + 3 && inl((u16)(io + 12)) == 1; /* one write reached the VMM */
	}
	return 0;
}

/* edu (1234:11e8) behind the VT-d model, where present (--testdev-iommu): -1 if absent,
 * else whether liveness, factorial and a DMA through the IOMMU's tables (IOVA 0x5000 ->
 * `page`, both ways) work. */
static u64 vtd_root[512] __attribute__((aligned(4096))), vtd_context[512] __attribute__((aligned(4096)));
static u64 vtd_l3[512] __attribute__((aligned(4096))), vtd_l2[512] __attribute__((aligned(4096)));
static u64 vtd_l1[512] __attribute__((aligned(4096)));
static volatile u32 page[1024] __attribute__((aligned(4096)));
static int edu_ok(void) {
	for (u32 fn = 0; fn < 256; fn++) {
		if (cf8(fn, 0) != 0x11e81234) continue;
		volatile u32 *edu = (volatile u32 *)(cf8(fn, 0x10) & ~0xfu);
		volatile u32 *vtd = (volatile u32 *)0xfed90000u;
		edu[1] = 0x1234; /* liveness: reads back inverted */
		edu[2] = 6;      /* factorial */
		if (edu[1] != ~0x1234u || edu[2] != 720) return 0;
		/* Root entry for bus 0 -> context entry for devfn fn -> 3 levels -> page. */
		vtd_root[0] = (u32)vtd_context | 1;
		vtd_context[2 * fn] = (u32)vtd_l3 | 1;
		vtd_context[2 * fn + 1] = 1; /* 39-bit address width */
		vtd_l3[0] = (u32)vtd_l2 | 3;
		vtd_l2[0] = (u32)vtd_l1 | 3;
		vtd_l1[5] = (u32)page | 3;
		vtd[0x20 / 4] = (u32)vtd_root;
		vtd[0x24 / 4] = 0;
		vtd[0x18 / 4] = 1u << 30;             /* set the root table pointer */
		vtd[0x18 / 4] = vtd[0x1c / 4] | 1u << 31; /* translation on */
		page[0] = 0xfeedbeef;
		u32 dma[][3] = {{0x5000, 0x40000, 1}, {0x40000, 0x5004, 3}}; /* to the buffer, back 4 on */
		for (int i = 0; i < 2; i++) {
			edu[0x80 / 4] = dma[i][0], edu[0x84 / 4] = 0;
			edu[0x88 / 4] = dma[i][1], edu[0x8c / 4] = 0;
			edu[0x90 / 4] = 4, edu[0x94 / 4] = 0;
			edu[0x98 / 4] = dma[i][2];
		}
		vtd[0x18 / 4] = 0; /* translation off again */
		return page[1] == 0xfeedbeef;
	}
	return -1;
}

int main32(u32 magic, struct mb_info *info) {
	u64 mem = param(0), vcpus = param(1), initrd_size = param(2), initrd_sum = param(3);
	check(magic == 0x2badb002, "EAX holds the multiboot magic");
	check((info->flags & 0x45) == 0x45, "info has memory, command line and memory map");
	puts("mbcheck: cmdline [");
	puts((const char *)info->cmdline);
	puts("]\n");
	u64 ram = 0;
	for (u32 at = 0; at < info->mmap_length;) {
		struct mb_mmap *e = (struct mb_mmap *)(info->mmap_addr + at);
		if (e->type == 1) ram += e->len;
		at += e->size + 4;
	}
	puts("mbcheck: memory map RAM ");
	putx(ram);
	putc('\n');
	u64 below_hole = mem < MMIO_HOLE_START ? mem : MMIO_HOLE_START;
	check(ram + (0x100000 - 0x9fc00) == mem, "RAM in the memory map = --mem less 640K-1M");
	check((u64)info->mem_upper * 1024 + 0x100000 == below_hole, "mem_upper = RAM from 1 MiB to the hole");
	check(info->mem_lower == 639, "mem_lower = 639 KiB");
	if (initrd_size) {
		struct mb_module *m = (struct mb_module *)info->mods_addr;
		u64 sum = 0;
		for (u32 a = m->start; a < m->end; a++) sum += *(u8 *)a;
		check(info->mods_count == 1 && m->end - m->start == initrd_size && sum == initrd_sum,
		      "the initrd is the one module, byte for byte");
	}
	check(fw_cfg(0, 4) == 0x554d4551, "fw_cfg signature QEMU");
	check(fw_cfg(3, 8) == mem, "fw_cfg RAM size = --mem");
	check(fw_cfg(5, 2) == vcpus, "fw_cfg CPU count = --vcpus");
	outl(0xe0, 0x12345678);
	outb(0xe8 + 3, 0xab);
	check(inl(0xe0) == 0xab345678, "pc-testdev scratch register");
	check(pci_testdev_ok(), "pci-testdev: found, test header, a write counted");
	int edu = edu_ok();
	if (edu >= 0) check(edu, "edu behind the IOMMU: liveness, factorial, DMA through its page tables");
	/* What the BIOS left: real-mode vectors whose IRQ handlers acknowledge the PICs, the
	 * PICs with the timer and the cascade unmasked, the PIT ticking (interrupts are off
	 * here, so the timer's request stays pending in the master's IRR). */
	u32 irq0 = peek32(8 * 4), irq11 = peek32(0x73 * 4);
	u8 *h0 = (u8 *)((irq0 >> 16) * 16 + (irq0 & 0xffff)), *h11 = (u8 *)((irq11 >> 16) * 16 + (irq11 & 0xffff));
	check(h0[0] == 0x50 && h0[3] == 0xe6 && h0[4] == 0x20 && h0[6] == 0xcf && h11[4] == 0xa0 && h11[6] == 0x20,
	      "real-mode vectors: IRQ 0 acknowledges the master PIC, IRQ 11 both");
	check(inb(0x21) == 0xfa && inb(0xa1) == 0xff, "PIC masks: only the timer and the cascade open");
	outb(0x20, 0x0a); /* OCW3: reads of 0x20 return the IRR */
	u32 polls = 0;
	while (!(inb(0x20) & 1) && polls < 2000000) polls++;
	check(inb(0x20) & 1, "the PIT ticks: IRQ 0 pending");
	puts(failures ? "mbcheck: SOME CHECKS FAILED\n" : "mbcheck: all checks passed\n");
	return failures ? 1 : 0;
}
