/* Starts every other vCPU the MADT lists with INIT and SIPI through the local APIC, as an OS
 * does. Each application processor comes up through the runtime's real-mode trampoline,
 * prints that it checked in (an exit on its own vCPU) and parks. Exits 0 when all did. */
#include "acpi.h"

extern char ap_trampoline[], ap_trampoline_end[];

static volatile u32 checked_in;
static volatile u32 print_lock;

#define APIC_SVR 0xf0
#define APIC_ICR_LO 0x300
#define APIC_ICR_HI 0x310
/* ICR: INIT / startup, level assert, to all excluding self. */
#define ICR_INIT 0x000c4500u
#define ICR_SIPI 0x000c4600u

static void apic_write(u32 reg, u32 v) { *(volatile u32 *)(LAPIC_GPA + reg) = v; }
static u32 apic_read(u32 reg) { return *(volatile u32 *)(LAPIC_GPA + reg); }

static void wait_cycles(u64 cycles) {
	u64 start = rdtsc();
	while (rdtsc() - start < cycles) __asm__ volatile("pause");
}

void ap_main(u32 apic_id) {
	while (__atomic_exchange_n(&print_lock, 1, __ATOMIC_ACQUIRE)) __asm__ volatile("pause");
	print("smp: cpu %u checked in\n", apic_id);
	__atomic_store_n(&print_lock, 0, __ATOMIC_RELEASE);
	__atomic_fetch_add(&checked_in, 1, __ATOMIC_SEQ_CST);
}

int main(void) {
	u64 madt = acpi_table(acpi_rsdp(), "APIC");
	u32 cpus = madt ? madt_cpus(madt) : 1;
	print("smp: the MADT lists %u cpus\n", cpus);
	u8 *dst = (u8 *)AP_TRAMPOLINE_GPA;
	for (char *p = ap_trampoline; p < ap_trampoline_end; p++) *dst++ = (u8)*p;
	apic_write(APIC_SVR, apic_read(APIC_SVR) | 0x1ff);
	apic_write(APIC_ICR_HI, 0);
	apic_write(APIC_ICR_LO, ICR_INIT);
	wait_cycles(10000000);
	for (int i = 0; i < 2; i++) {
		apic_write(APIC_ICR_LO, ICR_SIPI | (AP_TRAMPOLINE_GPA >> 12));
		wait_cycles(2000000);
	}
	/* Every instruction at CPL0 is emulated here: give the others seconds, not microseconds. */
	u64 start = rdtsc(), limit = param(0, 30) * 3000000000ULL;
	while (__atomic_load_n(&checked_in, __ATOMIC_SEQ_CST) < cpus - 1 && rdtsc() - start < limit)
		__asm__ volatile("pause");
	while (__atomic_exchange_n(&print_lock, 1, __ATOMIC_ACQUIRE)) __asm__ volatile("pause");
	u32 n = __atomic_load_n(&checked_in, __ATOMIC_SEQ_CST);
	print("smp: %u of %u other cpus checked in\n", n, cpus - 1);
	return n == cpus - 1 ? 0 : 1;
}
