/* Fails on purpose, to exercise the VMM's error paths. Param 0: 1 (default) = triple
 * fault from CPL3 (a page fault with no IDT), 2 = spin forever with no exit, 3 = reset
 * through the i8042 (as `reboot=k`), 4 = ACPI soft-off (S5), 5 = ACPI reset register,
 * 6 = int3 twice and int $0x21 once at CPL0, each gate to a counting handler (instructions
 * KVM cannot emulate on a nested host),
 * 7 = SSE arithmetic at CPL0 (paddq, pshufd, pxor from memory, movdqu to memory: KVM's
 * emulator knows none of them, so on a nested host the VMM completes them),
 * 8 = syscall from CPL3 twice to a supervisor-only entry, which returns by sysretq the
 * first time and ends the run with its CS as the status the second: 8 when the switch to CPL0 happened (by the CPU, or finished by the VMM), 14 when
 * the entry page faulted at CPL3 instead (this nested host, without the VMM's help),
 * 9 = vmcall at CPL0 (KVM answers an unknown hypercall with -1000; this nested host never
 * completes it, and its host profile answers it the same way). */
#include "runtime.h"

extern u64 pml4_table __asm__("pml4");

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

/* SYSCALL's target: reports the code segment it runs in through the debug-exit port (IOPL 3
 * lets it even if it is wrongly still at CPL3). */
void syscall_entry(void);
volatile u64 syscall_hits;
__asm__(".text\nsyscall_entry:\n\tmovabs $syscall_hits, %rax\n\tincq (%rax)\n\tcmpq $2, (%rax)\n\tjae 1f\n\t"
	"sysretq\n1:\tmov %cs, %eax\n\tmov $" "0xf4" ", %dx\n\toutl %eax, %dx\n2:\tjmp 2b\n");

static void wrmsr(u32 msr, u64 v) { __asm__ volatile("wrmsr" ::"c"(msr), "a"((u32)v), "d"((u32)(v >> 32))); }
static u64 rdmsr(u32 msr) {
	u32 lo, hi;
	__asm__ volatile("rdmsr" : "=a"(lo), "=d"(hi) : "c"(msr));
	return ((u64)hi << 32) | lo;
}

/* The page-fault handler: a fault in the 2 MiB page at 0x80200000 (the test's ordinary fault) is fixed by
 * mapping that page and retried; any other ends the run with status 14. */
volatile u64 *volatile pf_fix_pte;
volatile u64 pf_fix_value, pf_fixed;
void pf_handler(void);
__asm__(".text\npf_handler:\n\tpushq %rax\n\tpushq %rcx\n\tmovq %cr2, %rax\n\t"
	"shrq $21, %rax\n\tcmpq $0x401, %rax\n\tjne 1f\n\t"
	"movabs $pf_fix_value, %rcx\n\tmovq (%rcx), %rcx\n\tmovabs $pf_fix_pte, %rax\n\tmovq (%rax), %rax\n\t"
	"movq %rcx, (%rax)\n\tmovq %cr2, %rax\n\tinvlpg (%rax)\n\tmovabs $pf_fixed, %rax\n\tincq (%rax)\n\t"
	"popq %rcx\n\tpopq %rax\n\taddq $8, %rsp\n\tiretq\n"
	"1:\tmov $14, %eax\n\tmov $" "0xf4" ", %dx\n\toutl %eax, %dx\n2:\tjmp 2b\n");

static void syscall_from_user(void) {
	/* The entry is reached through a supervisor-only alias at 2 GiB (as a kernel's entry
	 * page is supervisor-only), and a #PF gate points at pf_handler: a SYSCALL the host
	 * leaves at CPL3 faults on fetching it, unless the VMM finishes the switch first. */
	u64 *pml4 = (u64 *)((u64)&pml4_table);
	u64 *pdpt = (u64 *)(pml4[0] & ~0xfffULL);
	u64 *pd_2g = (u64 *)(pdpt[2] & ~0xfffULL);
	u64 entry = (u64)syscall_entry;
	pd_2g[0] = (entry & ~0x1fffffULL) | 0x83; /* present, writable, 2 MiB, supervisor */
	u64 alias = 0x80000000ULL + (entry & 0x1fffff);
	__asm__ volatile("invlpg (%0)" ::"r"(alias) : "memory");
	u64 h = (u64)pf_handler;
	idt[2 * 14] = (h & 0xffff) | (0x08ULL << 16) | (0x8eULL << 40) | (((h >> 16) & 0xffff) << 48);
	idt[2 * 14 + 1] = h >> 32;
	struct __attribute__((packed)) { u16 limit; u64 base; } ptr = {sizeof(idt) - 1, (u64)idt};
	__asm__ volatile("lidt %0" ::"m"(ptr));
	/* A fault from CPL3 switches to the TSS's RSP0: a GDT with a TSS, as a kernel has. */
	static u64 gdt[8] __attribute__((aligned(16)));
	static u32 tss[26] __attribute__((aligned(16)));
	static u8 fault_stack[4096] __attribute__((aligned(16)));
	struct __attribute__((packed)) { u16 limit; u64 base; } cur;
	__asm__ volatile("sgdt %0" : "=m"(cur));
	for (int i = 0; i < 6; i++) gdt[i] = ((u64 *)cur.base)[i];
	u64 t = (u64)tss, sp0 = (u64)fault_stack + sizeof(fault_stack);
	tss[1] = (u32)sp0;
	tss[2] = (u32)(sp0 >> 32);
	tss[25] = sizeof(tss) << 16; /* I/O map base past the end: no bitmap */
	gdt[6] = (sizeof(tss) - 1) | ((t & 0xffffff) << 16) | (0x89ULL << 40) | (((t >> 24) & 0xff) << 56);
	gdt[7] = t >> 32;
	struct __attribute__((packed)) { u16 limit; u64 base; } gp = {sizeof(gdt) - 1, (u64)gdt};
	__asm__ volatile("lgdt %0\n\tltr %w1" ::"m"(gp), "r"(0x30) : "memory");
	wrmsr(0xc0000081, (0x18ULL << 48) | (0x08ULL << 32)); /* STAR: kernel CS 0x08, sysret base 0x18 */
	wrmsr(0xc0000082, alias);                              /* LSTAR (after the IDT, as Linux) */
	wrmsr(0xc0000084, 0);                                  /* FMASK */
	wrmsr(0xc0000080, rdmsr(0xc0000080) | 1);              /* EFER.SCE */
	/* An ordinary page fault first (at CPL0, fixed by the handler), which the VMM must let
	 * through to the handler it watches. */
	pd_2g[1] = 0; /* not present (the runtime maps all 4 GiB) */
	__asm__ volatile("invlpg (%0)" ::"r"(0x80200000ULL) : "memory");
	pf_fix_pte = &pd_2g[1];
	pf_fix_value = (entry & ~0x1fffffULL) | 0x83;
	u64 seen = *(volatile u64 *)(0x80200000ULL + (entry & 0x1fffff));
	print("crash: %lu ordinary page fault handled, then read %s\n", pf_fixed,
	      seen == *(volatile u64 *)entry ? "the right bytes" : "wrong bytes");
	enter_user();
	/* The first returns by sysretq; the second ends the run. */
	__asm__ volatile("syscall\n\tsyscall" ::: "rax", "rcx", "r11", "memory");
}

int main(void) {
	u64 mode = param(0, 1);
	print("crash: mode %lu\n", mode);
	if (mode == 3) outb(0x64, 0xfe);
	if (mode == 4) outw(0x604, (5 << 10) | (1 << 13)); /* PM1a_CNT: SLP_TYP 5, SLP_EN */
	if (mode == 5) outb(0x60c, 1);
	if (mode == 6) return int3_survived();
	if (mode == 7) return sse_survived();
	if (mode == 8) syscall_from_user();
	if (mode == 9) {
		u64 ret = 0x12345; /* a hypercall number KVM does not know */
		__asm__ volatile("vmcall" : "+a"(ret)::"memory");
		print("crash: vmcall returned %ld\n", (long)ret);
		return 9;
	}
	if (mode >= 3 && mode <= 5) {
		print("crash: still running after mode %lu\n", mode);
		return 3;
	}
	if (mode == 1) {
		/* Drop the runtime's IDT: the page fault below cannot be delivered. */
		struct __attribute__((packed)) { u16 limit; u64 base; } none = {0, 0};
		__asm__ volatile("lidt %0" ::"m"(none));
	}
	enter_user();
	if (mode == 2)
		for (;;) __asm__ volatile("pause");
	*(volatile u64 *)0x7fff00000000ULL = 1; /* not mapped: #PF, no IDT: triple fault */
	return 0;
}
