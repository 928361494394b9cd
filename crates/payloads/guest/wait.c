/* A guest that boots, says so, and then waits with nothing to do until the VMM stops it
 * (an orchestrator's idle microVM: `bench fleet` and the API tests start these). It halts
 * with interrupts off, so it costs no host CPU and makes no exit while it waits. Words on
 * its command line change what it waits for:
 *   "spin": spins at CPL3 instead, all CPU and no exit (a busy guest whose vCPU thread's
 *           CPU time shows whether it runs, as a pause must stop it);
 *   "kbd":  halts with IRQ 1 routed through the IOAPIC to a handler that reads the PS/2
 *           keyboard, and on Ctrl-Alt-Del resets through the i8042, as Linux does;
 *   "boot-timer": first writes 123 to Firecracker's boot-timer device (0xc0000000), as
 *           Firecracker's test images do once booted;
 *   "echo": with "kbd", answers each Ctrl-Alt-Del with "wait: ctrl-alt-del N" and goes on
 *           waiting (`bench density`'s ping of a restored guest) instead of resetting.
 * Param 0 = N: first writes N MiB of guest RAM from 16 MiB up, the part beyond the MMIO
 * hole above 4 GiB (a `rep stosq` of a pattern, so the pages are neither zero nor left to
 * the VMM's sparse files). */
#include "runtime.h"

/* The words above found on the command line, in one pass that looks further only at
 * their first letters: this runs at CPL0, where each instruction costs about a
 * microsecond on a nested host, before the first line. */
enum { BOOT_TIMER = 1, KBD = 2, SPIN = 4, ECHO = 8 };
static unsigned cmdline_words(void) {
	static const char *const words[] = {"boot-timer", "kbd", "spin", "echo"};
	unsigned found = 0;
	if (!boot_start_info) return 0;
	const char *c = (const char *)*(u64 *)((u64)boot_start_info + 24); /* PVH cmdline_paddr */
	for (; c && *c; c++) {
		if (*c != 'b' && *c != 'k' && *c != 's' && *c != 'e') continue;
		for (unsigned w = 0; w < 4; w++) {
			int i = 0;
			while (words[w][i] && c[i] == words[w][i]) i++;
			if (!words[w][i]) found |= 1u << w;
		}
	}
	return found;
}

#define KBD_VECTOR 0x21
static u64 idt[2 * 256] __attribute__((aligned(16)));
static volatile u8 keys[8];
static volatile u32 nkeys;

/* Called from kbd_isr: takes every byte the controller holds, then ends the interrupt. */
void kbd_irq(void) {
	while (inb(0x64) & 1) {
		u8 b = inb(0x60);
		if (nkeys < sizeof(keys)) keys[nkeys++] = b;
	}
	*(volatile u32 *)0xfee000b0ULL = 0; /* LAPIC EOI */
}
void kbd_isr(void);
__asm__(".text\nkbd_isr:\n\tpush %rax\n\tpush %rcx\n\tpush %rdx\n\tpush %rsi\n\tpush %rdi\n\tpush %r8\n"
	"\tpush %r9\n\tpush %r10\n\tpush %r11\n\tcall kbd_irq\n\tpop %r11\n\tpop %r10\n\tpop %r9\n\tpop %r8\n"
	"\tpop %rdi\n\tpop %rsi\n\tpop %rdx\n\tpop %rcx\n\tpop %rax\n\tiretq\n");

static void wait_for_ctrl_alt_del(int echo) {
	u64 h = (u64)kbd_isr;
	idt[2 * KBD_VECTOR] = (h & 0xffff) | (0x08ULL << 16) | (0x8eULL << 40) | (((h >> 16) & 0xffff) << 48);
	idt[2 * KBD_VECTOR + 1] = h >> 32;
	idt[2 * 0xff] = idt[2 * KBD_VECTOR]; /* a spurious interrupt reads nothing and returns */
	idt[2 * 0xff + 1] = idt[2 * KBD_VECTOR + 1];
	struct __attribute__((packed)) { u16 limit; u64 base; } ptr = {sizeof(idt) - 1, (u64)idt};
	__asm__ volatile("lidt %0" ::"m"(ptr));
	/* IRQ 1 also reaches the 8259 PIC, whose vectors nobody set: mask it, as Linux does. */
	outb(0x21, 0xff);
	outb(0xa1, 0xff);
	*(volatile u32 *)0xfee000f0ULL = 0x1ff; /* LAPIC on, spurious vector 0xff */
	volatile u32 *ioapic = (volatile u32 *)0xfec00000ULL;
	ioapic[0] = 0x10 + 2 * 1 + 1; /* pin 1, high half: destination APIC 0 */
	ioapic[4] = 0;
	ioapic[0] = 0x10 + 2 * 1; /* low half: fixed, edge, active high, unmasked */
	ioapic[4] = KBD_VECTOR;
	print("wait: running; waiting for ctrl-alt-del\n");
	kbd_irq(); /* keys sent before IRQ 1 was routed raised their edge unseen: take them now */
	for (;;) {
		__asm__ volatile("sti; hlt; cli");
		if (nkeys >= 4 && keys[0] == 0x14 && keys[1] == 0x11 && keys[2] == 0xe0 && keys[3] == 0x71) {
			if (!echo) {
				print("wait: ctrl-alt-del; resetting\n");
				outb(0x64, 0xfe);
			}
			static u64 answered;
			print("wait: ctrl-alt-del %lu\n", ++answered);
			nkeys = 0;
		} else if (nkeys >= sizeof(keys)) {
			nkeys = 0;
		}
	}
}

/* Writes `bytes` of RAM from 16 MiB up, below the MMIO hole first and the rest above
 * 4 GiB (RAM's second part), one `rep stosq` of a pattern each, leaving 1 MiB at the top. */
static void fill(u64 bytes) {
	u64 ram = guest_mem_end(), from = 16ULL << 20;
	u64 low_end = (ram < MMIO_HOLE_START ? ram : MMIO_HOLE_START) - (1ULL << 20);
	u64 low = from < low_end ? low_end - from : 0;
	if (low > bytes) low = bytes;
	u64 high = ram > MMIO_HOLE_START ? ram - MMIO_HOLE_START - (1ULL << 20) : 0;
	if (high > bytes - low) high = bytes - low;
	for (u64 gib = 0; gib < (high + (1ULL << 30) - 1) >> 30; gib++)
		if (map_high((4ULL << 30) + (gib << 30))) high = gib << 30;
	u64 at = from, count = low / 8;
	__asm__ volatile("rep stosq" : "+D"(at), "+c"(count) : "a"(0x9e3779b97f4a7c15ULL) : "memory");
	at = 4ULL << 30, count = high / 8;
	__asm__ volatile("rep stosq" : "+D"(at), "+c"(count) : "a"(0x9e3779b97f4a7c15ULL) : "memory");
	print("wait: wrote %lu MiB\n", (low + high) >> 20);
}

int main(void) {
	unsigned words = cmdline_words();
	if (words & BOOT_TIMER) *(volatile u8 *)0xc0000000ULL = 123;
	u64 fill_mib = param(0, 0);
	if (fill_mib) fill(fill_mib << 20);
	if (words & KBD) wait_for_ctrl_alt_del(words & ECHO);
	if (words & SPIN) {
		print("wait: running; spinning until stopped\n");
		enter_user();
		for (;;) __asm__ volatile("" ::: "memory");
	}
	print("wait: running; waiting to be stopped\n");
	for (;;) __asm__ volatile("cli; hlt");
	return 0;
}
