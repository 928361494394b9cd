/*
 * PVH entry: the VMM (or QEMU) starts us in 32-bit protected mode, paging off,
 * %ebx = hvm_start_info. We switch to long mode with identity-mapped page tables that
 * are static data in the image (no loop at CPL0, where every instruction is emulated
 * on a nested host), then call runtime_start(start_info) in C.
 */
	.section .note.Xen, "a", @note
	.p2align 2
	.long 4, 8, 18          /* namesz, descsz, XEN_ELFNOTE_PHYS32_ENTRY */
	.asciz "Xen"
	.p2align 2
	.quad pvh_start

	.section .text.entry, "ax"
	.code32
	.globl pvh_start
pvh_start:
	cli
	lgdt gdt_ptr
	movl %cr4, %eax
	orl $0x20, %eax                 /* PAE */
	movl %eax, %cr4
	movl $pml4, %eax
	movl %eax, %cr3
	movl $0xc0000080, %ecx          /* EFER */
	rdmsr
	orl $0x100, %eax                /* LME */
	wrmsr
	movl %cr0, %eax
	orl $0x80000001, %eax           /* PG | PE */
	movl %eax, %cr0
	ljmp $0x08, $long_mode

	.code64
	.globl long_mode
long_mode:              /* also the ELF entry, for a VMM that starts us in 64-bit mode */
	movw $0x10, %ax
	movw %ax, %ds
	movw %ax, %es
	movw %ax, %ss
	xorw %ax, %ax
	movw %ax, %fs
	movw %ax, %gs
	movq $stack_top, %rsp
	movl %ebx, %edi
	xorl %esi, %esi
	call runtime_start
1:	hlt
	jmp 1b

/* The 64-bit Linux boot protocol's entry, 0x200 past the start of the image (the
 * bzImage-shaped build puts it there): %rsi = zero page. */
	.section .text.bzentry, "ax"
	.globl linux64_start
linux64_start:
	cli
	lgdt gdt_ptr64
	movq $stack_top, %rsp
	pushq $0x08
	leaq 1f(%rip), %rax
	pushq %rax
	lretq
1:	movw $0x10, %ax
	movw %ax, %ds
	movw %ax, %es
	movw %ax, %ss
	movq %rsi, %rbx
	movq $pml4, %rax
	movq %rax, %cr3
	xorl %edi, %edi
	movq %rbx, %rsi
	call runtime_start
2:	hlt
	jmp 2b

/* One stub per vector, 16 bytes apart: push a zero where the CPU pushes no error code,
 * push the vector, go to the common handler (runtime.c: cpu_setup points the IDT here). */
	.section .text
	.p2align 4
	.globl isr_stubs
isr_stubs:
	.set vec, 0
	.rept 256
	.p2align 4
	.if (vec == 8) || (vec >= 10 && vec <= 14) || (vec == 17) || (vec == 21) || (vec == 29) || (vec == 30)
	.else
	pushq $0
	.endif
	pushq $vec
	jmp isr_common
	.set vec, vec + 1
	.endr

isr_common:            /* on the TSS's RSP0 stack: vector, error code, then the CPU's frame */
	movq %rsp, %rdi
	call isr_handler
3:	pause
	jmp 3b

	.section .data
	.p2align 3
	.globl gdt
gdt:
	.quad 0                         /* 0x00 null */
	.quad 0x00af9a000000ffff        /* 0x08 64-bit code, DPL0 */
	.quad 0x00cf92000000ffff        /* 0x10 data, DPL0 */
	.quad 0x00cffa000000ffff        /* 0x18 32-bit code, DPL3 (unused, keeps sysret layout) */
	.quad 0x00cff2000000ffff        /* 0x20 data, DPL3 -> selector 0x23 */
	.quad 0x00affa000000ffff        /* 0x28 64-bit code, DPL3 -> selector 0x2b */
	.quad 0, 0                      /* 0x30 64-bit TSS, filled in by cpu_setup */
gdt_end:
gdt_ptr:                        /* for lgdt in 32-bit mode: a 4-byte base */
	.word gdt_end - gdt - 1
	.long gdt
	.globl gdt_ptr64
gdt_ptr64:                      /* for lgdt in 64-bit mode: an 8-byte base */
	.word gdt_end - gdt - 1
	.quad gdt

/* Identity map of the low 4 GiB with 2 MiB pages, all user-accessible so CPL3 loops
 * can reach RAM, the shared page and MMIO without a switch back to CPL0. Higher GiBs (a
 * 64-bit BAR another VMM placed there) get a page directory from `high_pd` on demand, and
 * beyond 512 GiB the spare PDPT `high_pdpt`. */
	.section .data.pagetables, "aw"
	.p2align 12
	.globl pml4, pdpt, high_pdpt, high_pd
pml4:
	.quad pdpt + 0x7
	.fill 511, 8, 0
pdpt:
	.quad pd + 0x0000 + 0x7
	.quad pd + 0x1000 + 0x7
	.quad pd + 0x2000 + 0x7
	.quad pd + 0x3000 + 0x7
	.fill 508, 8, 0                 /* above 4 GiB: mapped on demand (map_high) */
high_pdpt:
	.fill 512, 8, 0                 /* a spare PDPT: BARs above 512 GiB (Cloud Hypervisor's) */
high_pd:
	.fill 2 * 512, 8, 0             /* two spare page directories */
pd:
	.set page, 0
	.rept 2048
	.quad (page << 21) | 0x87       /* present, writable, user, 2 MiB */
	.set page, page + 1
	.endr

	.section .bss.stack, "aw", @nobits
	.p2align 12
	.space 65536
stack_top:
