/*
 * Counts at CPL3 and says so: a tick every 2^20 iterations ("counter: tick N", N from 1),
 * done after param 0 ticks (default 400). Its count lives in guest memory and registers
 * only, so a VM snapshotted mid-count and restored in another VMM goes on from the tick it
 * had reached: the first tick after a restore follows the last one before it.
 * Results: 0 = ticks.
 */
#include "runtime.h"

int main(void) {
	u64 ticks = param(0, 400);
	enter_user();
	volatile u64 n = 0;
	for (u64 tick = 1; tick <= ticks; tick++) {
		for (u64 i = 0; i < (1u << 20); i++) n++;
		print("counter: tick %lu\n", tick);
		set_result(0, tick);
	}
	print("counter: done at tick %lu (%lu iterations)\n", ticks, n);
	return 0;
}
