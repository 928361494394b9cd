/* A guest that boots, says so, and then waits with nothing to do until the VMM stops it
 * (an orchestrator's idle microVM: `bench fleet` and the API tests start these). It halts
 * with interrupts off, so it costs no host CPU and makes no exit while it waits. */
#include "runtime.h"

int main(void) {
	print("wait: running; waiting to be stopped\n");
	for (;;) __asm__ volatile("cli; hlt");
	return 0;
}
