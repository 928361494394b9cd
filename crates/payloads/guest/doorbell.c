/*
 * Doorbell lab guest. For each step the VMM lists: BEGIN on the lab control port (the
 * VMM wires the doorbell for that path and fills in the spec), ring N times in a tight
 * loop timed with the TSC, END, then read the device's count and check it is exactly N.
 * Params: 0 = rings per step, 1 = CPL of the loop + 1 (default 3), 2 = number of steps.
 */
#include "runtime.h"

static volatile u64 *const shared = (volatile u64 *)SHARED_PAGE_GPA;

static u64 ring_loop(u64 kind, u64 size, u64 addr, u64 value, u64 n) {
	u16 port = (u16)addr;
	volatile u64 *seq = &shared[POLL_SEQ_SLOT], *ack = &shared[POLL_ACK_SLOT];
	u64 t0 = rdtsc();
	if (kind == RING_PIO && size == 1)
		for (u64 i = 0; i < n; i++) outb(port, (u8)value);
	else if (kind == RING_PIO && size == 2)
		for (u64 i = 0; i < n; i++) outw(port, (u16)value);
	else if (kind == RING_PIO)
		for (u64 i = 0; i < n; i++) outl(port, (u32)value);
	else if (kind == RING_MMIO && size == 1)
		for (u64 i = 0; i < n; i++) *(volatile u8 *)addr = (u8)value;
	else if (kind == RING_MMIO && size == 2)
		for (u64 i = 0; i < n; i++) *(volatile u16 *)addr = (u16)value;
	else if (kind == RING_MMIO && size == 4)
		for (u64 i = 0; i < n; i++) *(volatile u32 *)addr = (u32)value;
	else if (kind == RING_MMIO)
		for (u64 i = 0; i < n; i++) *(volatile u64 *)addr = value;
	else if (kind == RING_CPUID)
		for (u64 i = 0; i < n; i++) {
			u32 a = 0, b, c = 0, d;
			__asm__ volatile("cpuid" : "+a"(a), "=b"(b), "+c"(c), "=d"(d));
		}
	else if (kind == RING_POLL)
		for (u64 i = 1; i <= n; i++) {
			*seq = i;
			while (*ack != i) __asm__ volatile("pause");
		}
	return rdtsc() - t0;
}

static u64 read_count(u64 kind) {
	if (kind == RING_MMIO) return mmio_read(DOORBELL_MMIO_GPA + 8, 8);
	return inl(DOORBELL_PIO_COUNT) | ((u64)inl(DOORBELL_PIO_COUNT + 4) << 32);
}

int main(void) {
	u64 n = param(0, 1000), loop_cpl = param(1, 4) - 1, steps = param(2, 1);
	int failed = 0;
	print("doorbell: %lu steps of %lu rings at CPL%lu\n", steps, n, loop_cpl);
	if (loop_cpl == 3) enter_user();
	for (u64 step = 0; step < steps; step++) {
		lab_op(LAB_OP_BEGIN, step);
		u64 kind = shared[LAB_SPEC_SLOT], size = shared[LAB_SPEC_SLOT + 1];
		u64 addr = shared[LAB_SPEC_SLOT + 2], value = shared[LAB_SPEC_SLOT + 3];
		if (kind < RING_PIO || kind > RING_POLL) {
			print("doorbell: no lab answered on the control port; nothing to measure "
			      "(run it with `exitless bench doorbell`)\n");
			return 0;
		}
		u64 cycles = ring_loop(kind, size, addr, value, n);
		set_result(0, cycles);
		lab_op(LAB_OP_END, step);
		u64 count = kind == RING_CPUID ? n : read_count(kind);
		if (count != n) {
			print("doorbell: step %lu: FAIL: device counted %lu of %lu rings\n", step, count, n);
			failed = 1;
		} else {
			print("doorbell: step %lu: %lu rings in %lu cycles, all counted\n", step, n, cycles);
		}
	}
	return failed;
}
