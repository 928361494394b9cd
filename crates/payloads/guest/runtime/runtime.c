#include "runtime.h"
#include "acpi.h"
#include "pci.h"

typedef __builtin_va_list va_list;
#define va_start __builtin_va_start
#define va_arg __builtin_va_arg
#define va_end __builtin_va_end

static volatile u64 *const shared = (volatile u64 *)SHARED_PAGE_GPA;

void *boot_start_info;
void *boot_zero_page;

/* The PVH boot protocol promises no IDT and no usable TSS (Firecracker and Cloud
 * Hypervisor leave a TSS without an I/O bitmap, so port I/O at CPL3 faults there): the
 * runtime brings its own. The I/O bitmap allows every port, for the CPL3 loops. */
struct tss64 {
	u32 reserved0;
	u64 rsp[3];
	u64 reserved1;
	u64 ist[7];
	u64 reserved2;
	u16 reserved3;
	u16 iomap_base;
} __attribute__((packed));

static struct {
	struct tss64 tss;
	u8 iomap[65536 / 8 + 1]; /* a clear bit allows the port; the last byte ends the map */
} __attribute__((packed, aligned(16))) tss_block;

struct idt_gate {
	u16 offset_lo, selector;
	u8 ist, type;
	u16 offset_mid;
	u32 offset_hi, reserved;
} __attribute__((packed));

static struct idt_gate idt[256] __attribute__((aligned(16)));
static u8 exception_stack[16384] __attribute__((aligned(16)));
extern u64 gdt[];
extern char gdt_ptr64[];
extern char isr_stubs[];

static void cpu_setup(void) {
	struct { u16 limit; u64 base; } __attribute__((packed)) idtr = { sizeof(idt) - 1, (u64)idt };
	u64 tss = (u64)&tss_block, limit = sizeof(tss_block) - 1;
	tss_block.tss.rsp[0] = (u64)exception_stack + sizeof(exception_stack);
	tss_block.tss.iomap_base = sizeof(struct tss64);
	tss_block.iomap[sizeof(tss_block.iomap) - 1] = 0xff;
	for (int v = 0; v < 256; v++) {
		u64 at = (u64)isr_stubs + 16 * (u64)v;
		idt[v] = (struct idt_gate){ (u16)at, 0x08, 0, 0x8e, (u16)(at >> 16), (u32)(at >> 32), 0 };
	}
	/* 64-bit available TSS (type 9), present, DPL0: two GDT slots at selector 0x30. */
	gdt[6] = (limit & 0xffff) | (tss & 0xffffff) << 16 | 0x89ULL << 40 | ((limit >> 16) & 0xf) << 48 |
		 ((tss >> 24) & 0xff) << 56;
	gdt[7] = tss >> 32;
	/* The 64-bit ELF entry runs on the VMM's GDT: the runtime's own has the TSS. */
	__asm__ volatile("lgdt %0" ::"m"(*gdt_ptr64));
	__asm__ volatile("lidt %0" ::"m"(idtr));
	__asm__ volatile("ltr %w0" ::"r"(0x30));
}

struct isr_frame {
	u64 vector, error, rip, cs, rflags, rsp, ss;
};

void isr_handler(struct isr_frame *f) {
	print("exitless runtime: exception %lu (error %lx) at rip %lx, cpl %lu\n", f->vector, f->error, f->rip, f->cs & 3);
	guest_exit(0xe0 + (u32)f->vector);
}

u64 pci_ecam_base = ECAM_GPA;

extern u64 pml4[512];
extern u64 pdpt[512];
extern u64 high_pdpt[512];
extern u64 high_pd[2][512];

static int pml4_high_used;

int map_high(u64 addr) {
	static u32 used;
	u64 gib = addr >> 30, top = addr >> 39;
	if (gib < 4 || top >= 512) return gib < 4 ? 0 : -1;
	/* The first 512 GiB hang off `pdpt`; one other 512 GiB region gets `high_pdpt`. */
	if (top && !(pml4[top] & 1)) {
		if (pml4_high_used) return -1;
		pml4[top] = (u64)high_pdpt | 0x7;
		pml4_high_used = 1;
	}
	u64 *dir = top ? (u64 *)(pml4[top] & ~0xfffULL) : pdpt;
	if (dir[gib & 511] & 1) return 0;
	if (used >= 2) return -1;
	for (u64 i = 0; i < 512; i++) high_pd[used][i] = (gib << 30) + (i << 21) + 0x87; /* 2 MiB, user, rw */
	dir[gib & 511] = (u64)high_pd[used++] | 0x7;
	return 0;
}

/* The MCFG's first allocation (bus 0's segment), if the platform has the table. */
static void find_ecam(void) {
	u64 mcfg = acpi_table(acpi_rsdp(), "MCFG");
	if (mcfg && *(volatile u32 *)(mcfg + 4) >= 44 + 16) pci_ecam_base = *(volatile u64 *)(mcfg + 44);
}

/* The command line's parameters: how the peers lab hands the same parameters to a
 * payload under every VMM (Firecracker's boot_args, Cloud Hypervisor's cmdline). */
#define MAX_CMDLINE_PARAMS 16
static u64 cmdline_params[MAX_CMDLINE_PARAMS];
static u32 cmdline_nparams;

static const char *boot_cmdline(void) {
	u64 at = 0;
	if (boot_start_info && *(volatile u32 *)boot_start_info == PVH_MAGIC)
		at = *(volatile u64 *)((u64)boot_start_info + 24);
	else if (boot_zero_page)
		at = *(volatile u32 *)((u64)boot_zero_page + 0x228);
	/* Only what the identity map covers. */
	return at && at < (4ULL << 30) - 4096 ? (const char *)at : 0;
}

/* Parsed on the first param() call, which most payloads make at CPL3: at CPL0 each
 * instruction costs about a microsecond on a nested host, and the scan of Firecracker's
 * 150-byte default command line was a millisecond of every start there. */
static void parse_cmdline_params(void) {
	static const char key[] = "exitless.params=";
	static int parsed;
	if (parsed) return;
	parsed = 1;
	const char *s = boot_cmdline();
	for (u32 scanned = 0; s && *s && scanned < 4096; s++, scanned++) {
		u32 k = 0;
		while (key[k] && s[k] == key[k]) k++;
		if (key[k]) continue;
		s += k;
		while (cmdline_nparams < MAX_CMDLINE_PARAMS) {
			u64 v = 0, base = 10;
			if (s[0] == '0' && (s[1] == 'x' || s[1] == 'X')) base = 16, s += 2;
			for (;; s++) {
				u64 d = *s >= '0' && *s <= '9' ? (u64)(*s - '0')
				      : base == 16 && (*s | 0x20) >= 'a' && (*s | 0x20) <= 'f' ? (u64)((*s | 0x20) - 'a' + 10)
				      : 99;
				if (d >= base) break;
				v = v * base + d;
			}
			cmdline_params[cmdline_nparams++] = v;
			if (*s != ',') break;
			s++;
		}
		return;
	}
}

void runtime_start(void *start_info, void *zero_page) {
	boot_start_info = start_info;
	boot_zero_page = zero_page;
	cpu_setup();
	find_ecam();
	guest_exit((u32)main());
}

/* ACPI soft-off through a hardware-reduced FADT's sleep control register (Cloud
 * Hypervisor's, which takes an i8042 reset as a reboot): SLP_TYP 5, SLP_EN. */
static void acpi_poweroff(void) {
	u64 fadt = acpi_table(acpi_rsdp(), "FACP");
	if (!fadt || *(volatile u32 *)(fadt + 4) < 244 + 12) return;
	u8 space = *(volatile u8 *)(fadt + 244);
	u64 reg = *(volatile u64 *)(fadt + 244 + 4);
	if (space == 1 && reg && reg < 0x10000) outb((u16)reg, (5 << 2) | (1 << 5));
}

__attribute__((noreturn)) void guest_exit(u32 status) {
	outl(DEBUG_EXIT_PORT, status);
	/* No debug-exit device listens (another VMM): ACPI soft-off where the platform has a
	 * sleep control register, then a reset through the i8042, which ends Firecracker. */
	acpi_poweroff();
	outb(0x64, 0xfe);
	for (;;)
		__asm__ volatile("pause");
}

void enter_user(void) {
	__asm__ volatile(
		"mov %%rsp, %%rax\n\t"
		"pushq $0x23\n\t"      /* ss */
		"pushq %%rax\n\t"      /* rsp */
		"pushq $0x3002\n\t"    /* rflags: IOPL 3, IF 0 */
		"pushq $0x2b\n\t"      /* cs */
		"lea 1f(%%rip), %%rax\n\t"
		"pushq %%rax\n\t"
		"iretq\n"
		"1:" ::: "rax", "memory");
}

int have_vmm_params(void) { return shared[0] == SHARED_MAGIC; }

u64 param(u32 index, u64 fallback) {
	u64 v = have_vmm_params() ? shared[SHARED_PARAM_SLOT + index] : 0;
	if (!v) parse_cmdline_params();
	if (!v && index < cmdline_nparams) v = cmdline_params[index];
	return v ? v : fallback;
}

void lab_op(u64 op, u64 step) {
	if (have_vmm_params() && shared[SHARED_LAB_SLOT]) outl(LAB_CONTROL_PORT, (u32)((op << 16) | step));
}

/* Without exitless's shared page (another VMM), the RAM the PVH memory map lists (its
 * type-1 entries; start_info version 1 has the map at 40, its count at 48), else 128 MiB. */
u64 guest_mem_end(void) {
	if (have_vmm_params()) return shared[SHARED_MEM_END_SLOT];
	u64 ram = 0;
	if (boot_start_info && *(volatile u32 *)boot_start_info == PVH_MAGIC && *(volatile u32 *)((u64)boot_start_info + 4) >= 1) {
		const u8 *map = (const u8 *)*(volatile u64 *)((u64)boot_start_info + 40);
		u32 n = *(volatile u32 *)((u64)boot_start_info + 48);
		for (u32 i = 0; map && i < n && i < 128; i++)
			if (*(const u32 *)(map + 24 * i + 16) == 1) ram += *(const u64 *)(map + 24 * i + 8);
	}
	return ram ? ram : 128ULL << 20;
}

void set_result(u32 index, u64 value) { shared[SHARED_RESULT_SLOT + index] = value; }

u64 rand64(u64 *state) {
	u64 x = *state;
	x ^= x >> 12;
	x ^= x << 25;
	x ^= x >> 27;
	*state = x;
	return x * 0x2545f4914f6cdd1dULL;
}

void port_write(u16 port, u32 size, u32 value) {
	if (size == 1) outb(port, (u8)value);
	else if (size == 2) outw(port, (u16)value);
	else outl(port, value);
}

u32 port_read(u16 port, u32 size) {
	if (size == 1) return inb(port);
	if (size == 2) return inw(port);
	return inl(port);
}

void mmio_write(u64 addr, u32 size, u64 value) {
	if (size == 1) *(volatile u8 *)addr = (u8)value;
	else if (size == 2) *(volatile u16 *)addr = (u16)value;
	else if (size == 4) *(volatile u32 *)addr = (u32)value;
	else *(volatile u64 *)addr = value;
}

u64 mmio_read(u64 addr, u32 size) {
	if (size == 1) return *(volatile u8 *)addr;
	if (size == 2) return *(volatile u16 *)addr;
	if (size == 4) return *(volatile u32 *)addr;
	return *(volatile u64 *)addr;
}

static void put(char c) {
	if (c == '\n') outb(SERIAL_PORT, '\r');
	outb(SERIAL_PORT, (u8)c);
}

static void put_num(u64 v, u32 base, int negative, int width, char pad) {
	char buf[24];
	int n = 0;
	do {
		buf[n++] = "0123456789abcdef"[v % base];
		v /= base;
	} while (v);
	if (negative) buf[n++] = '-';
	while (width-- > n) put(pad);
	while (n) put(buf[--n]);
}

void print(const char *fmt, ...) {
	va_list ap;
	va_start(ap, fmt);
	for (; *fmt; fmt++) {
		if (*fmt != '%') { put(*fmt); continue; }
		int width = 0, is_long = 0;
		char pad = fmt[1] == '0' ? '0' : ' ';
		while (fmt[1] >= '0' && fmt[1] <= '9') width = width * 10 + (*++fmt - '0');
		if (fmt[1] == 'l') { is_long = 1; fmt++; }
		switch (*++fmt) {
		case 's': for (const char *s = va_arg(ap, const char *); *s; s++) put(*s); break;
		case 'c': put((char)va_arg(ap, int)); break;
		case 'd': {
			i64 v = is_long ? va_arg(ap, i64) : va_arg(ap, int);
			put_num(v < 0 ? (u64)-v : (u64)v, 10, v < 0, width, pad);
			break;
		}
		case 'u': put_num(is_long ? va_arg(ap, u64) : va_arg(ap, u32), 10, 0, width, pad); break;
		case 'x': put_num(is_long ? va_arg(ap, u64) : va_arg(ap, u32), 16, 0, width, pad); break;
		case '%': put('%'); break;
		case 0: fmt--; break;
		default: put('?'); break;
		}
	}
	va_end(ap);
}

/* What an application processor runs once the trampoline (smp.S) brought it to long mode;
 * a payload that starts other vCPUs defines its own. */
__attribute__((weak)) void ap_main(u32 apic_id) { (void)apic_id; }
