#include "runtime.h"

typedef __builtin_va_list va_list;
#define va_start __builtin_va_start
#define va_arg __builtin_va_arg
#define va_end __builtin_va_end

static volatile u64 *const shared = (volatile u64 *)SHARED_PAGE_GPA;

void *boot_start_info;
void *boot_zero_page;

void runtime_start(void *start_info, void *zero_page) {
	boot_start_info = start_info;
	boot_zero_page = zero_page;
	guest_exit((u32)main());
}

__attribute__((noreturn)) void guest_exit(u32 status) {
	outl(DEBUG_EXIT_PORT, status);
	for (;;) /* only reached where no debug-exit device listens */
		__asm__ volatile("pause");
}

void enter_user(void) {
	__asm__ volatile(
		"mov %%rsp, %%rax\n\t"
		"pushq $0x23\n\t"      /* ss */
		"pushq %%rax\n\t"      /* rsp */
		"pushq $0x3002\n\t"    /* rflags: IOPL 3, IF 0 */
		"pushq $0x2b\n\t"      /* cs */
		"lea 1f(%%rip), %%rax\n\t"
		"pushq %%rax\n\t"
		"iretq\n"
		"1:" ::: "rax", "memory");
}

int have_vmm_params(void) { return shared[0] == SHARED_MAGIC; }

u64 param(u32 index, u64 fallback) {
	u64 v = have_vmm_params() ? shared[SHARED_PARAM_SLOT + index] : 0;
	return v ? v : fallback;
}

void lab_op(u64 op, u64 step) {
	if (have_vmm_params() && shared[SHARED_LAB_SLOT]) outl(LAB_CONTROL_PORT, (u32)((op << 16) | step));
}

u64 guest_mem_end(void) { return have_vmm_params() ? shared[SHARED_MEM_END_SLOT] : 128ULL << 20; }

void set_result(u32 index, u64 value) { shared[SHARED_RESULT_SLOT + index] = value; }

u64 rand64(u64 *state) {
	u64 x = *state;
	x ^= x >> 12;
	x ^= x << 25;
	x ^= x >> 27;
	*state = x;
	return x * 0x2545f4914f6cdd1dULL;
}

void port_write(u16 port, u32 size, u32 value) {
	if (size == 1) outb(port, (u8)value);
	else if (size == 2) outw(port, (u16)value);
	else outl(port, value);
}

u32 port_read(u16 port, u32 size) {
	if (size == 1) return inb(port);
	if (size == 2) return inw(port);
	return inl(port);
}

void mmio_write(u64 addr, u32 size, u64 value) {
	if (size == 1) *(volatile u8 *)addr = (u8)value;
	else if (size == 2) *(volatile u16 *)addr = (u16)value;
	else if (size == 4) *(volatile u32 *)addr = (u32)value;
	else *(volatile u64 *)addr = value;
}

u64 mmio_read(u64 addr, u32 size) {
	if (size == 1) return *(volatile u8 *)addr;
	if (size == 2) return *(volatile u16 *)addr;
	if (size == 4) return *(volatile u32 *)addr;
	return *(volatile u64 *)addr;
}

static void put(char c) {
	if (c == '\n') outb(SERIAL_PORT, '\r');
	outb(SERIAL_PORT, (u8)c);
}

static void put_num(u64 v, u32 base, int negative, int width, char pad) {
	char buf[24];
	int n = 0;
	do {
		buf[n++] = "0123456789abcdef"[v % base];
		v /= base;
	} while (v);
	if (negative) buf[n++] = '-';
	while (width-- > n) put(pad);
	while (n) put(buf[--n]);
}

void print(const char *fmt, ...) {
	va_list ap;
	va_start(ap, fmt);
	for (; *fmt; fmt++) {
		if (*fmt != '%') { put(*fmt); continue; }
		int width = 0, is_long = 0;
		char pad = fmt[1] == '0' ? '0' : ' ';
		while (fmt[1] >= '0' && fmt[1] <= '9') width = width * 10 + (*++fmt - '0');
		if (fmt[1] == 'l') { is_long = 1; fmt++; }
		switch (*++fmt) {
		case 's': for (const char *s = va_arg(ap, const char *); *s; s++) put(*s); break;
		case 'c': put((char)va_arg(ap, int)); break;
		case 'd': {
			i64 v = is_long ? va_arg(ap, i64) : va_arg(ap, int);
			put_num(v < 0 ? (u64)-v : (u64)v, 10, v < 0, width, pad);
			break;
		}
		case 'u': put_num(is_long ? va_arg(ap, u64) : va_arg(ap, u32), 10, 0, width, pad); break;
		case 'x': put_num(is_long ? va_arg(ap, u64) : va_arg(ap, u32), 16, 0, width, pad); break;
		case '%': put('%'); break;
		case 0: fmt--; break;
		default: put('?'); break;
		}
	}
	va_end(ap);
}

/* What an application processor runs once the trampoline (smp.S) brought it to long mode;
 * a payload that starts other vCPUs defines its own. */
__attribute__((weak)) void ap_main(u32 apic_id) { (void)apic_id; }
