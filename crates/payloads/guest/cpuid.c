/*
 * CPUID guest: prints what the vCPU's CPUID says, one line per leaf, for the tests of CPU
 * templates and normalization to read from inside the guest:
 *   cpuid 0x00000007.0: eax=00000000 ebx=219c07ab ecx=... edx=...
 * the leaves 0, 1, 6, 7.0, 0xa, 0xd.0, 0xd.1, 0x8000_0001, 0x8000_0008, then the brand
 * string as "brand: ..."; and, if param 0 is given, the leaf it names (subleaf param 1).
 * Exits 0.
 */
#include "runtime.h"

static void show(u32 leaf, u32 subleaf) {
	u32 a, b, c, d;
	__asm__ volatile("cpuid" : "=a"(a), "=b"(b), "=c"(c), "=d"(d) : "a"(leaf), "c"(subleaf));
	print("cpuid 0x%08x.%x: eax=%08x ebx=%08x ecx=%08x edx=%08x\n", leaf, subleaf, a, b, c, d);
}

int main(void) {
	static const u32 leaves[][2] = {{0, 0}, {1, 0}, {6, 0}, {7, 0}, {0xa, 0}, {0xd, 0}, {0xd, 1},
					{0x80000001, 0}, {0x80000008, 0}};
	for (unsigned i = 0; i < sizeof(leaves) / sizeof(leaves[0]); i++) show(leaves[i][0], leaves[i][1]);
	u32 brand[13] = {0};
	for (u32 i = 0; i < 3; i++)
		__asm__ volatile("cpuid"
				 : "=a"(brand[4 * i]), "=b"(brand[4 * i + 1]), "=c"(brand[4 * i + 2]), "=d"(brand[4 * i + 3])
				 : "a"(0x80000002 + i), "c"(0));
	print("brand: %s\n", (const char *)brand);
	u64 leaf = param(0, ~0ULL);
	if (leaf != ~0ULL) show((u32)leaf, (u32)param(1, 0));
	return 0;
}
