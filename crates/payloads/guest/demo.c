/* The default guest: prints from CPL0, drops to CPL3 and runs a timed loop there. */
#include "runtime.h"

int main(void) {
	print("exitless demo guest: hello from CPL%d\n", cpl());
	enter_user();
	u64 t0 = rdtsc();
	volatile u64 sum = 0;
	for (u64 i = 0; i < 1000000; i++) sum += i;
	u64 cycles = rdtsc() - t0;
	print("now at CPL%d with IOPL 3: 1M loop iterations in %lu TSC cycles (sum %lu)\n", cpl(),
	      cycles, (u64)sum);
	print("goodbye\n");
	return 0;
}
