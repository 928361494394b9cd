/* Sleeps in ACPI S3 and wakes by the CMOS RTC's alarm, as kvm-unit-tests' `s3` does (with
 * --testdevs): prints the RTC's date and time, copies a real-mode stub to the FACS's waking
 * vector, arms the RTC wake (PM1 RTC_EN, an alarm that matches every second, the alarm
 * interrupt) and writes SLP_TYP 1 with SLP_EN. The stub, run after the wake in real mode,
 * exits with the PM1 status it finds (WAK_STS | RTC_STS = 0x8400). Where S3 is not offered
 * the write does nothing and it exits 1. */
#include "acpi.h"

#define STUB_GPA 0x3000

static u8 rtc(u8 reg) {
	outb(0x70, reg);
	return inb(0x71);
}
static void rtc_set(u8 reg, u8 v) {
	outb(0x70, reg);
	outb(0x71, v);
}
static u32 bcd(u8 v) { return (v >> 4) * 10 + (v & 15); }

int main(void) {
	u64 fadt = acpi_table(acpi_rsdp(), "FACP");
	if (!fadt) {
		print("s3wake: no FADT\n");
		return 2;
	}
	u32 facs = *(u32 *)(fadt + 36), pm1a_evt = *(u32 *)(fadt + 56), pm1a_cnt = *(u32 *)(fadt + 64);
	u8 t[7];
	do {
		for (int i = 0; i < 7; i++) t[i] = rtc((u8[]){0x32, 9, 8, 7, 4, 2, 0}[i]);
	} while (rtc(0) != t[6]);
	print("s3wake: rtc %u%02u-%02u-%02u %02u:%02u:%02u\n", bcd(t[0]), bcd(t[1]), bcd(t[2]), bcd(t[3]), bcd(t[4]),
	      bcd(t[5]), bcd(t[6]));
	/* mov dx, PM1a_EVT; in ax, dx; mov dx, DEBUG_EXIT_PORT; out dx, ax; 1: hlt; jmp 1b */
	u8 stub[] = {0xba, (u8)pm1a_evt, (u8)(pm1a_evt >> 8), 0xed, 0xba, DEBUG_EXIT_PORT & 0xff,
		     DEBUG_EXIT_PORT >> 8, 0xef, 0xf4, 0xeb, 0xfd};
	for (u32 i = 0; i < sizeof(stub); i++) ((volatile u8 *)STUB_GPA)[i] = stub[i];
	*(volatile u32 *)(u64)(facs + 12) = STUB_GPA;
	outw(pm1a_evt + 2, 1 << 10); /* RTC_EN */
	for (u8 alarm = 1; alarm <= 5; alarm += 2) rtc_set(alarm, 0xc0);
	rtc_set(0x0b, rtc(0x0b) | 0x20); /* AIE */
	print("s3wake: entering S3\n");
	outw(pm1a_cnt, (1 << 13) | (1 << 10));
	/* Still here: S3 was not entered. */
	u64 start = rdtsc();
	while (rdtsc() - start < 100000000ULL) __asm__ volatile("pause");
	print("s3wake: S3 not entered\n");
	return 1;
}
