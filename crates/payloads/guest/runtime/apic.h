/* The local APIC as payloads use it, and the start of the other vCPUs with INIT and SIPI
 * through it, as an OS does: each comes up through the runtime's real-mode trampoline
 * (smp.S) and calls ap_main(apic_id) on a stack of its own. */
#pragma once
#include "runtime.h"

extern char ap_trampoline[], ap_trampoline_end[];

#define APIC_SVR 0xf0
#define APIC_ICR_LO 0x300
#define APIC_ICR_HI 0x310
/* ICR: INIT / startup, level assert, to all excluding self. */
#define ICR_INIT 0x000c4500u
#define ICR_SIPI 0x000c4600u

static inline void apic_write(u32 reg, u32 v) { *(volatile u32 *)(LAPIC_GPA + reg) = v; }
static inline u32 apic_read(u32 reg) { return *(volatile u32 *)(LAPIC_GPA + reg); }

static inline void wait_cycles(u64 cycles) {
	u64 start = rdtsc();
	while (rdtsc() - start < cycles) __asm__ volatile("pause");
}

/* Copies the trampoline into place, enables the APIC, then INIT and two SIPIs to all the
 * others (at CPL0: it touches the APIC and low memory). */
static inline void start_other_cpus(void) {
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
}
