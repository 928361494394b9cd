/* Starts every other vCPU the MADT lists with INIT and SIPI through the local APIC, as an OS
 * does. Each application processor comes up through the runtime's real-mode trampoline,
 * prints that it checked in (an exit on its own vCPU) and parks. Exits 0 when all did. */
#include "acpi.h"
#include "apic.h"

static volatile u32 checked_in;
static volatile u32 print_lock;

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
	start_other_cpus();
	/* Every instruction at CPL0 is emulated here: give the others seconds, not microseconds. */
	u64 start = rdtsc(), limit = param(0, 30) * 3000000000ULL;
	while (__atomic_load_n(&checked_in, __ATOMIC_SEQ_CST) < cpus - 1 && rdtsc() - start < limit)
		__asm__ volatile("pause");
	while (__atomic_exchange_n(&print_lock, 1, __ATOMIC_ACQUIRE)) __asm__ volatile("pause");
	u32 n = __atomic_load_n(&checked_in, __ATOMIC_SEQ_CST);
	print("smp: %u of %u other cpus checked in\n", n, cpus - 1);
	return n == cpus - 1 ? 0 : 1;
}
