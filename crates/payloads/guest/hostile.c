/*
 * Hostile guest: random port and MMIO accesses of every size, string port I/O, accesses
 * that straddle a device's range, and garbage to every device register. The VMM must
 * keep running; we end by printing a summary and exiting 0.
 * Params: 0 = seed, 1 = random accesses per kind.
 */
#include "runtime.h"

/* Ports we leave alone: debug-exit (a write ends the run), the serial port (covered
 * separately so the console stays readable). */
static int port_forbidden(u32 port, u32 size) {
	u32 end = port + size;
	return (port < DEBUG_EXIT_PORT + 4 && end > DEBUG_EXIT_PORT) ||
	       (port < SERIAL_PORT + 8 && end > SERIAL_PORT) || end > 0x10000;
}

/* MMIO we leave alone: the in-kernel IOAPIC and local APIC (garbage there could send this
 * very vCPU an NMI it has no handler for). */
static int mmio_forbidden(u64 addr) {
	return (addr >= 0xfec00000 && addr < 0xfed00000) || (addr >= 0xfee00000 && addr < 0xfef00000);
}

static u8 buffer[512];

int main(void) {
	u64 seed = param(0, 0x5eed) | 1, rounds = param(1, 2000);
	u64 mem_end = guest_mem_end();
	u64 ports = 0, mmios = 0, strings = 0;
	enter_user();

	/* Every serial register, every size, garbage; then put the UART back (LCR 8N1 with
	 * DLAB clear, MCR without loopback) so our own output still reaches the console. */
	for (u32 reg = 0; reg < 8; reg++)
		for (u32 size = 1; size <= 4; size <<= 1) {
			port_write(SERIAL_PORT + reg, size, (u32)rand64(&seed) & 0xfefefefe);
			(void)port_read(SERIAL_PORT + reg, size);
		}
	outb(SERIAL_PORT + 3, 0x03);
	outb(SERIAL_PORT + 4, 0x00);
	outb(SERIAL_PORT + 1, 0x00);
	/* Reads of the debug-exit port, and wider accesses that straddle its range. */
	for (u32 size = 1; size <= 4; size <<= 1) (void)port_read(DEBUG_EXIT_PORT, size);
	port_write(DEBUG_EXIT_PORT - 1, 2, 0xffff);
	port_write(DEBUG_EXIT_PORT - 2, 4, 0xffffffff);
	port_write(DEBUG_EXIT_PORT + 3, 2, 0xffff);
	port_write(SERIAL_PORT + 7, 2, 0xffff);
	port_write(0xffff, 1, 0);
	(void)port_read(0xffff, 1);

	for (u64 i = 0; i < rounds; i++) {
		u32 size = 1u << (rand64(&seed) % 3);
		u32 port = (u32)rand64(&seed) & 0xffff;
		if (port_forbidden(port, size)) continue;
		if (rand64(&seed) & 1) port_write((u16)port, size, (u32)rand64(&seed));
		else (void)port_read((u16)port, size);
		ports++;
	}
	for (u64 i = 0; i < rounds; i++) {
		u32 size = 1u << (rand64(&seed) % 4);
		u64 span = 0x100000000ULL - mem_end - 8;
		u64 addr = (mem_end + rand64(&seed) % span) & ~(u64)(size - 1);
		if (i & 1) addr |= 1; /* unaligned too */
		if (mmio_forbidden(addr)) continue;
		if (rand64(&seed) & 1) mmio_write(addr, size, rand64(&seed));
		else (void)mmio_read(addr, size);
		mmios++;
	}
	for (u64 i = 0; i < rounds / 8; i++) {
		u32 size = 1u << (rand64(&seed) % 3);
		u64 count = 1 + rand64(&seed) % 64;
		u32 port = (u32)rand64(&seed) & 0xffff;
		if (port_forbidden(port, size)) continue;
		void *buf = buffer;
		if (rand64(&seed) & 1) {
			if (size == 1) __asm__ volatile("rep outsb" : "+S"(buf), "+c"(count) : "d"(port) : "memory");
			else if (size == 2) __asm__ volatile("rep outsw" : "+S"(buf), "+c"(count) : "d"(port) : "memory");
			else __asm__ volatile("rep outsl" : "+S"(buf), "+c"(count) : "d"(port) : "memory");
		} else {
			if (size == 1) __asm__ volatile("rep insb" : "+D"(buf), "+c"(count) : "d"(port) : "memory");
			else if (size == 2) __asm__ volatile("rep insw" : "+D"(buf), "+c"(count) : "d"(port) : "memory");
			else __asm__ volatile("rep insl" : "+D"(buf), "+c"(count) : "d"(port) : "memory");
		}
		strings++;
	}
	print("hostile: survived %lu port, %lu mmio and %lu string accesses\n", ports, mmios, strings);
	return 0;
}
