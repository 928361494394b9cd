/* Fails on purpose, to exercise the VMM's error paths. Param 0: 1 (default) = triple
 * fault from CPL3 (a page fault with no IDT), 2 = spin forever with no exit, 3 = reset
 * through the i8042 (as `reboot=k`), 4 = ACPI soft-off (S5), 5 = ACPI reset register,
 * 6 = int3 twice and int $0x21 once at CPL0, each gate to a counting handler (instructions
 * KVM cannot emulate on a nested host),
 * 7 = SSE arithmetic at CPL0 (paddq, pshufd, pxor from memory, movdqu to memory: KVM's
 * emulator knows none of them, so on a nested host the VMM completes them). */
#include "runtime.h"

/* An IDT whose #BP and 0x21 gates point at bp_handler, which counts and returns. */
static volatile u64 bp_hits;
static u64 idt[2 * 0x22] __attribute__((aligned(16)));
void bp_handler(void);
__asm__(".text\nbp_handler:\n\tincq bp_hits(%rip)\n\tiretq\n");

static int int3_survived(void) {
	u64 h = (u64)bp_handler;
	for (int v = 3; v <= 0x21; v += 0x21 - 3) {
		idt[2 * v] = (h & 0xffff) | (0x08ULL << 16) | (0x8eULL << 40) | (((h >> 16) & 0xffff) << 48);
		idt[2 * v + 1] = h >> 32;
	}
	struct __attribute__((packed)) { u16 limit; u64 base; } ptr = {sizeof(idt) - 1, (u64)idt};
	__asm__ volatile("lidt %0" ::"m"(ptr));
	__asm__ volatile("int3");
	__asm__ volatile("int3");
	__asm__ volatile("int $0x21");
	print("crash: int3 twice and int $0x21, handler ran %lu times\n", bp_hits);
	return bp_hits == 3 ? 0 : 1;
}

static int sse_survived(void) {
	u64 cr4;
	__asm__ volatile("mov %%cr4, %0" : "=r"(cr4));
	__asm__ volatile("mov %0, %%cr4" ::"r"(cr4 | 0x600)); /* OSFXSR, OSXMMEXCPT */
	static u64 a[2] __attribute__((aligned(16))) = {0xffffffffffffffffULL, 2};
	static u64 b[2] __attribute__((aligned(16))) = {1, 5};
	static u64 k[2] __attribute__((aligned(16))) = {0x0f0f0f0f0f0f0f0fULL, 0xf0f0f0f0f0f0f0f0ULL};
	static u64 out[3];
	__asm__ volatile("movdqa %1, %%xmm14\n\t"
			 "movdqa %2, %%xmm15\n\t"
			 "paddq %%xmm15, %%xmm14\n\t"    /* {0, 7}: no carry between lanes */
			 "pshufd $0x4e, %%xmm14, %%xmm1\n\t" /* {7, 0} */
			 "pxor %3, %%xmm1\n\t"
			 "movdqu %%xmm1, 4+%0\n\t"        /* a misaligned store */
			 : "=m"(out)
			 : "m"(a), "m"(b), "m"(k)); /* no XMM clobbers to name: this code has no SSE */
	u64 lo = *(u64 *)((u8 *)out + 4), hi = *(u64 *)((u8 *)out + 12);
	print("crash: sse at CPL0 gave %lx %lx\n", lo, hi);
	return lo == (7 ^ 0x0f0f0f0f0f0f0f0fULL) && hi == 0xf0f0f0f0f0f0f0f0ULL ? 0 : 1;
}

int main(void) {
	u64 mode = param(0, 1);
	print("crash: mode %lu\n", mode);
	if (mode == 3) outb(0x64, 0xfe);
	if (mode == 4) outw(0x604, (5 << 10) | (1 << 13)); /* PM1a_CNT: SLP_TYP 5, SLP_EN */
	if (mode == 5) outb(0x60c, 1);
	if (mode == 6) return int3_survived();
	if (mode == 7) return sse_survived();
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
