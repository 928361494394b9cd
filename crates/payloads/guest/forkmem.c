/*
 * Memory a fork must keep apart, for the fork tests: fills param 0 MiB of guest RAM from
 * 16 MiB up (default 8) at CPL3 with a generation's pattern, each word a hash of its
 * address and the generation's nonce (drawn with RDRAND where the CPU has it, and the
 * TSC), then forever: checks every word holds its generation's pattern, says
 * "forkmem: gen G ok", draws a new nonce and writes generation G + 1. Every copy of the
 * guest (the parent that goes on after a snapshot, each clone loaded from it) draws nonces
 * of its own, so a page one copy wrote that reached another is a word the other did not
 * write: it says "forkmem: BAD gen G at ADDR" and stops checking.
 * A snapshot taken anywhere in this resumes the loop where it stopped (its nonce and
 * position are in guest memory and registers), and the next check holds.
 * Results: 0 = generations checked, 1 = the address of a bad word (0 if none).
 */
#include "runtime.h"

static int have_rdrand;

static u64 draw(u64 previous) {
	u64 r = 0;
	if (have_rdrand) {
		unsigned char ok = 0;
		for (int i = 0; i < 10 && !ok; i++) __asm__ volatile("rdrand %0; setc %1" : "=r"(r), "=qm"(ok));
	}
	u64 state = (r ^ rdtsc() ^ (previous * 0x9e3779b97f4a7c15ULL)) | 1;
	return rand64(&state);
}

static inline u64 word(u64 nonce, u64 addr) {
	u64 x = (addr ^ nonce) * 0xff51afd7ed558ccdULL;
	return x ^ (x >> 29);
}

int main(void) {
	u64 mib = param(0, 8);
	u32 eax = 1, ebx, ecx = 0, edx;
	__asm__ volatile("cpuid" : "+a"(eax), "=b"(ebx), "+c"(ecx), "=d"(edx));
	have_rdrand = (ecx >> 30) & 1;
	enter_user();
	u64 from = 16ULL << 20, to = from + (mib << 20);
	if (to > guest_mem_end() - (1ULL << 20)) to = guest_mem_end() - (1ULL << 20);
	volatile u64 nonce = draw(0);
	for (u64 a = from; a < to; a += 8) *(volatile u64 *)a = word(nonce, a);
	print("forkmem: %lu MiB written, rdrand %d\n", (to - from) >> 20, have_rdrand);
	for (u64 gen = 1;; gen++) {
		for (u64 a = from; a < to; a += 8) {
			u64 found = *(volatile u64 *)a, want = word(nonce, a);
			if (found != want) {
				print("forkmem: BAD gen %lu at %lx: %lx, not %lx\n", gen, a, found, want);
				set_result(1, a);
				for (;;) __asm__ volatile("pause");
			}
		}
		print("forkmem: gen %lu ok\n", gen);
		set_result(0, gen);
		nonce = draw(nonce);
		for (u64 a = from; a < to; a += 8) *(volatile u64 *)a = word(nonce, a);
	}
	return 0;
}
