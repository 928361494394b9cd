/*
 * Counts at CPL3 and says so: a tick every 2^20 iterations ("counter: tick N", N from 1),
 * done after param 0 ticks (default 400). Its count lives in guest memory and registers
 * only, so a VM snapshotted mid-count and restored in another VMM goes on from the tick it
 * had reached: the first tick after a restore follows the last one before it.
 * With param 1 = N, it first writes N MiB of guest RAM from 16 MiB up (a pattern, so the
 * pages are not zero): what a snapshot's memory file must then hold. Once done, it reads
 * the pattern back ("counter: checked N MiB, W words wrong"): a guest restored from a
 * snapshot checks that its memory came back.
 * Results: 0 = ticks, 1 = words of the pattern found wrong.
 */
#include "runtime.h"

int main(void) {
	u64 ticks = param(0, 400), dirty_mib = param(1, 0);
	enter_user();
	u64 from = 16ULL << 20, to = from + (dirty_mib << 20);
	if (to > guest_mem_end() - (1ULL << 20)) to = guest_mem_end() - (1ULL << 20);
	for (u64 a = from; a < to; a += 8) *(volatile u64 *)a = a * 0x9e3779b97f4a7c15ULL;
	if (dirty_mib) print("counter: wrote %lu MiB\n", (to - from) >> 20);
	volatile u64 n = 0;
	for (u64 tick = 1; tick <= ticks; tick++) {
		for (u64 i = 0; i < (1u << 20); i++) n++;
		print("counter: tick %lu\n", tick);
		set_result(0, tick);
	}
	print("counter: done at tick %lu (%lu iterations)\n", ticks, n);
	if (dirty_mib) {
		u64 wrong = 0;
		for (u64 a = from; a < to; a += 8)
			if (*(volatile u64 *)a != a * 0x9e3779b97f4a7c15ULL) wrong++;
		set_result(1, wrong);
		print("counter: checked %lu MiB, %lu words wrong\n", (to - from) >> 20, wrong);
	}
	return 0;
}
