/* A guest that boots, says so, and then waits with nothing to do until the VMM stops it
 * (an orchestrator's idle microVM: `bench fleet` and the API tests start these). It halts
 * with interrupts off, so it costs no host CPU and makes no exit while it waits. With
 * "spin" on its command line it spins at CPL3 instead: all CPU, no exit (a busy guest whose
 * vCPU thread's CPU time shows whether it runs, as a pause must stop it). */
#include "runtime.h"

static int cmdline_says_spin(void) {
	if (!boot_start_info) return 0;
	const char *c = (const char *)*(u64 *)((u64)boot_start_info + 24); /* PVH cmdline_paddr */
	for (; c && *c; c++)
		if (c[0] == 's' && c[1] == 'p' && c[2] == 'i' && c[3] == 'n') return 1;
	return 0;
}

int main(void) {
	if (cmdline_says_spin()) {
		print("wait: running; spinning until stopped\n");
		enter_user();
		for (;;) __asm__ volatile("" ::: "memory");
	}
	print("wait: running; waiting to be stopped\n");
	for (;;) __asm__ volatile("cli; hlt");
	return 0;
}
