/* The guest runtime every payload links against: port I/O, serial print, exit through
 * the debug-exit port, TSC timing, the shared page, and the switch to CPL3. */
#pragma once
#include "abi.h"

typedef unsigned char u8;
typedef unsigned short u16;
typedef unsigned int u32;
typedef unsigned long u64;
typedef long i64;

static inline void outb(u16 port, u8 v) { __asm__ volatile("outb %0, %1" ::"a"(v), "Nd"(port)); }
static inline void outw(u16 port, u16 v) { __asm__ volatile("outw %0, %1" ::"a"(v), "Nd"(port)); }
static inline void outl(u16 port, u32 v) { __asm__ volatile("outl %0, %1" ::"a"(v), "Nd"(port)); }
static inline u8 inb(u16 port) { u8 v; __asm__ volatile("inb %1, %0" : "=a"(v) : "Nd"(port)); return v; }
static inline u16 inw(u16 port) { u16 v; __asm__ volatile("inw %1, %0" : "=a"(v) : "Nd"(port)); return v; }
static inline u32 inl(u16 port) { u32 v; __asm__ volatile("inl %1, %0" : "=a"(v) : "Nd"(port)); return v; }

/* Port or MMIO access of 1, 2, 4 (or 8, MMIO only) bytes. */
void port_write(u16 port, u32 size, u32 value);
u32 port_read(u16 port, u32 size);
void mmio_write(u64 addr, u32 size, u64 value);
u64 mmio_read(u64 addr, u32 size);

static inline u64 rdtsc(void) {
	u32 lo, hi;
	__asm__ volatile("lfence; rdtsc" : "=a"(lo), "=d"(hi)::"memory");
	return ((u64)hi << 32) | lo;
}

static inline int cpl(void) {
	u16 cs;
	__asm__ volatile("mov %%cs, %0" : "=r"(cs));
	return cs & 3;
}

/* printf with %s %c %d %u %x %lu %ld %lx (and a field width for numbers). */
void print(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
__attribute__((noreturn)) void guest_exit(u32 status);

/* Drop to CPL3 with IOPL 3 (port I/O still allowed), interrupts off; returns at CPL3. */
void enter_user(void);
/* Identity-maps the GiB holding `addr` if it lies above 4 GiB (a 64-bit BAR); -1 if out of
 * spare page directories. */
int map_high(u64 addr);

/* Sleep in the VMM until a device interrupt is delivered or `us` microseconds pass (the
 * idle port: this host cannot halt a CPL3 guest, so waiting is a paravirtual exit). */
static inline void idle_wait(u32 us) { outl(IDLE_PORT, us); }

/* The shared page: parameters from the VMM and results for it. A parameter the shared
 * page leaves 0 (or that has no shared page: QEMU, Firecracker, Cloud Hypervisor) comes
 * from the kernel command line's "exitless.params=v0,v1,..." (decimal or 0x hex), and
 * failing that is `fallback`. */
u64 param(u32 index, u64 fallback);
void set_result(u32 index, u64 value);
int have_vmm_params(void);
/* Tells the lab (if one answers on its control port) that step `step` begins, ends or
 * reaches its measured part (LAB_OP_*). Outside a lab it does nothing. */
void lab_op(u64 op, u64 step);
u64 guest_mem_end(void);

/* Small deterministic PRNG (xorshift64*). */
u64 rand64(u64 *state);

#define PVH_MAGIC 0x336ec578u

/* What the boot protocol handed over: the PVH start info (PVH entry), or the Linux zero
 * page (64-bit Linux entry); the other is null. */
extern void *boot_start_info;
extern void *boot_zero_page;

int main(void);
