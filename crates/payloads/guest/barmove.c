/* A BAR on the move under a reader on another vCPU. The application processor moves the lab
 * doorbell's BAR0 back and forth between its home and a free address, publishing each
 * completed move under a sequence count; the bootstrap processor, at CPL3, waits a while
 * inside the guest, then reads a doorbell register wherever the BAR is. A read that exits
 * after a move (even one that began before this vCPU entered the guest) must be dispatched
 * on the new layout: the doorbell never answers all-ones, an address without a device does.
 * Param 0 = moves and checked reads (1000 each), param 1 = TSC cycles the reader waits before
 * each read (300000). The mover goes on until the reader has checked its count, and the reader
 * until the mover has made its, so neither count depends on how the host schedules the two.
 * Exits 0 when no read saw all-ones. */
#include "acpi.h"
#include "apic.h"
#include "pci.h"

#define DOORBELL_IDS 0x0d00e1e5u
#define BAR0 0x10

static volatile u32 seq;   /* odd while a move is under way */
static volatile u64 bar;   /* where BAR0 is once seq is even */
static volatile u32 started, finished, read_enough;
static u32 fn, moves;
static u64 pause;
static u64 home, away;

void ap_main(u32 apic_id) {
	(void)apic_id;
	__atomic_store_n(&started, 1, __ATOMIC_SEQ_CST);
	for (u32 i = 0; i < moves || !__atomic_load_n(&read_enough, __ATOMIC_SEQ_CST); i++) {
		u64 to = (i & 1) ? home : away;
		__atomic_store_n(&seq, seq + 1, __ATOMIC_SEQ_CST);
		pci_write(PCI_PIO, fn, BAR0, 4, (u32)to);
		__atomic_store_n(&bar, to, __ATOMIC_SEQ_CST);
		__atomic_store_n(&seq, seq + 1, __ATOMIC_SEQ_CST);
		wait_cycles(3 * pause); /* a few reads between moves */
	}
	__atomic_store_n(&finished, 1, __ATOMIC_SEQ_CST);
}

/* The first address past every memory BAR on bus 0: free for the doorbell's 4 KiB. */
static u64 free_address(u32 *fns, u32 n) {
	u64 end = 0;
	for (u32 i = 0; i < n; i++) {
		u32 sizes[6];
		pci_size_bars(PCI_PIO, fns[i], sizes);
		for (u32 b = 0; b < 6; b++) {
			u32 v = pci_read(PCI_PIO, fns[i], BAR0 + 4 * b, 4);
			if (!sizes[b] || (v & 1)) continue;
			u64 e = (u64)(v & ~15u) + sizes[b];
			if (e > end) end = e;
		}
	}
	return (end + 0xffff) & ~0xffffUL;
}

int main(void) {
	moves = (u32)param(0, 1000);
	pause = param(1, 300000);
	u32 fns[16], n = pci_scan(PCI_PIO, fns, 16), found = 0;
	for (u32 i = 0; i < n; i++)
		if (pci_read(PCI_PIO, fns[i], 0, 4) == DOORBELL_IDS) fn = fns[i], found = 1;
	if (!found) {
		print("barmove: FAIL: no lab doorbell (run with --lab)\n");
		return 1;
	}
	home = pci_read(PCI_PIO, fn, BAR0, 4) & ~15u;
	away = free_address(fns, n);
	bar = home;
	print("barmove: doorbell 00:%02x.%u BAR0 moves %u times between %lx and %lx\n", fn >> 3, fn & 7, moves,
	      home, away);

	start_other_cpus();
	enter_user();
	u64 start = rdtsc(), limit = 60 * 3000000000ULL;
	while (!__atomic_load_n(&started, __ATOMIC_SEQ_CST) && rdtsc() - start < limit) __asm__ volatile("pause");
	if (!started) {
		print("barmove: FAIL: the other vCPU never started\n");
		return 1;
	}
	u64 checked = 0, stale = 0, torn = 0;
	while (checked < moves || !__atomic_load_n(&finished, __ATOMIC_SEQ_CST)) {
		if (checked >= moves) __atomic_store_n(&read_enough, 1, __ATOMIC_SEQ_CST);
		/* Inside the guest, past this vCPU's entry: a move that ends now is one the last
		 * entry did not see. */
		wait_cycles(pause);
		u32 before = __atomic_load_n(&seq, __ATOMIC_SEQ_CST);
		if (before & 1) continue;
		u64 at = __atomic_load_n(&bar, __ATOMIC_SEQ_CST);
		u32 v = (u32)mmio_read(at, 4);
		if (__atomic_load_n(&seq, __ATOMIC_SEQ_CST) != before) {
			torn++;
			continue;
		}
		checked++;
		if (v == 0xffffffffu) {
			if (stale < 5) print("barmove: a read at %lx after move %u saw no device\n", at, before / 2);
			stale++;
		}
	}
	print("barmove: %lu reads checked, %lu saw no device, %lu raced a move\n", checked, stale, torn);
	return stale == 0 ? 0 : 1;
}
