/*
 * Application processors start in real mode at AP_TRAMPOLINE_GPA (SIPI vector
 * AP_TRAMPOLINE_GPA >> 12), from the copy of ap_trampoline the BSP put there. The trampoline
 * is position-dependent on that copy: every address inside it is AP_TRAMPOLINE_GPA plus its
 * offset. It goes to protected mode, then long mode on the image's page tables, then jumps
 * to ap_long_mode in the image, which calls ap_main(apic_id) on a stack of its own.
 */
	.include "abi.inc"
	.set TRAMP_AT, AP_TRAMPOLINE_GPA
	.set AP_STACKS, 64

	.section .rodata.trampoline, "a"
	.code16
	.globl ap_trampoline, ap_trampoline_end
ap_trampoline:
	cli
	xorw %ax, %ax
	movw %ax, %ds
	lgdtl TRAMP_AT + (ap_gdt_ptr - ap_trampoline)
	movl %cr0, %eax
	orl $1, %eax
	movl %eax, %cr0
	ljmpl $0x18, $(TRAMP_AT + (ap_protected - ap_trampoline))
	.code32
ap_protected:
	movw $0x10, %ax
	movw %ax, %ds
	movw %ax, %es
	movw %ax, %ss
	movl %cr4, %eax
	orl $0x20, %eax                 /* PAE */
	movl %eax, %cr4
	movl $pml4, %eax
	movl %eax, %cr3
	movl $0xc0000080, %ecx          /* EFER.LME */
	rdmsr
	orl $0x100, %eax
	wrmsr
	movl %cr0, %eax
	orl $0x80000001, %eax           /* PG | PE */
	movl %eax, %cr0
	ljmp $0x08, $ap_long_mode
	.p2align 3
ap_gdt:
	.quad 0
	.quad 0x00af9a000000ffff        /* 0x08 64-bit code */
	.quad 0x00cf92000000ffff        /* 0x10 data */
	.quad 0x00cf9a000000ffff        /* 0x18 32-bit code */
ap_gdt_end:
ap_gdt_ptr:
	.word ap_gdt_end - ap_gdt - 1
	.long TRAMP_AT + (ap_gdt - ap_trampoline)
ap_trampoline_end:

	.text
	.code64
ap_long_mode:
	lgdt gdt_ptr64
	movw $0x10, %ax
	movw %ax, %ds
	movw %ax, %es
	movw %ax, %ss
	movl $1, %eax
	cpuid
	shrl $24, %ebx                  /* initial APIC ID */
	cmpl $AP_STACKS, %ebx
	jae 1f                          /* no stack for it: stays parked */
	movl %ebx, %edi
	leal 1(%ebx), %eax
	shll $12, %eax
	addq $ap_stacks, %rax
	movq %rax, %rsp
	call ap_main
1:	cli
	hlt
	jmp 1b

	.section .bss.ap_stacks, "aw", @nobits
	.p2align 12
ap_stacks:
	.space 4096 * (AP_STACKS + 1)
