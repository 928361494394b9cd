/* Fails on purpose, to exercise the VMM's error paths. Param 0: 1 (default) = triple
 * fault from CPL3 (a page fault with no IDT), 2 = spin forever with no exit. */
#include "runtime.h"

int main(void) {
	u64 mode = param(0, 1);
	print("crash: mode %lu\n", mode);
	enter_user();
	if (mode == 2)
		for (;;) __asm__ volatile("pause");
	*(volatile u64 *)0x7fff00000000ULL = 1; /* not mapped: #PF, no IDT: triple fault */
	return 0;
}
