/* Multiboot (v1) entry for 32-bit payloads: the header (ELF images need no address
 * fields), then a stack and a call to main32(magic, info). Its return value goes to the
 * debug-exit port. */
	.section .multiboot, "a"
	.align 4
	.long 0x1badb002, 0, -0x1badb002

	.text
	.globl start
start:
	movl $stack_top, %esp
	pushl %ebx
	pushl %eax
	call main32
	movw $0xf4, %dx
	outl %eax, %dx
1:	hlt
	jmp 1b

	.bss
	.align 16
	.space 16384
stack_top:
