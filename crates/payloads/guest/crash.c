/* Fails on purpose, to exercise the VMM's error paths. Param 0: 1 (default) = triple
 * fault from CPL3 (a page fault with no IDT), 2 = spin forever with no exit, 3 = reset
 * through the i8042 (as `reboot=k`), 4 = ACPI soft-off (S5), 5 = ACPI reset register,
 * 6 = int3 at CPL0 with a #BP handler (an instruction KVM cannot emulate on a nested host). */
#include "runtime.h"

/* An IDT whose #BP gate points at bp_handler, which counts and returns. */
static volatile u64 bp_hits;
static u64 idt[2 * 4] __attribute__((aligned(16)));
void bp_handler(void);
__asm__(".text\nbp_handler:\n\tincq bp_hits(%rip)\n\tiretq\n");

static int int3_survived(void) {
	u64 h = (u64)bp_handler;
	idt[2 * 3] = (h & 0xffff) | (0x08ULL << 16) | (0x8eULL << 40) | (((h >> 16) & 0xffff) << 48);
	idt[2 * 3 + 1] = h >> 32;
	struct __attribute__((packed)) { u16 limit; u64 base; } ptr = {sizeof(idt) - 1, (u64)idt};
	__asm__ volatile("lidt %0" ::"m"(ptr));
	__asm__ volatile("int3");
	__asm__ volatile("int3");
	print("crash: int3 twice, #BP handler ran %lu times\n", bp_hits);
	return bp_hits == 2 ? 0 : 1;
}

int main(void) {
	u64 mode = param(0, 1);
	print("crash: mode %lu\n", mode);
	if (mode == 3) outb(0x64, 0xfe);
	if (mode == 4) outw(0x604, (5 << 10) | (1 << 13)); /* PM1a_CNT: SLP_TYP 5, SLP_EN */
	if (mode == 5) outb(0x60c, 1);
	if (mode == 6) return int3_survived();
	if (mode >= 3 && mode <= 5) {
		print("crash: still running after mode %lu\n", mode);
		return 3;
	}
	enter_user();
	if (mode == 2)
		for (;;) __asm__ volatile("pause");
	*(volatile u64 *)0x7fff00000000ULL = 1; /* not mapped: #PF, no IDT: triple fault */
	return 0;
}
