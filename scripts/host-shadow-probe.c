// host-shadow-probe: does this host's KVM keep its shadow page tables in step with the
// page-table writes a guest makes at emulated CPL0? (docs/linux.md, "the TLS segfault")
//   cc -O2 -o host-shadow-probe scripts/host-shadow-probe.c && ./host-shadow-probe
// Each case is a fresh VM with one vCPU in long mode; the probe runs one guest step at a
// time, setting CPL and RIP between steps (guest CPL3 runs natively on a nested host, so
// only a CPL3 read goes through the shadow tables). Virtual 0x200000 first maps page A,
// a CPL3 read sees A; then the case rewrites the mapping to B (or removes it), the guest
// flushes (mov cr3 or invlpg), and a second CPL3 read must see B (or fault). The last two
// cases are controls: a write by the VMM, which no KVM can see, stays stale until a
// memslot is deleted (which makes x86 KVM drop every shadow page). Exit status 1 if any
// case read a stale mapping, apart from the first control.
#include <fcntl.h>
#include <linux/kvm.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <unistd.h>

// The guest's steps; each ends with `out 0x10`. RDI and RSI are the step's arguments.
extern const uint8_t g_begin[], g_pte_mov[], g_pte_stosq[], g_page_stosb[], g_page_movsb[],
    g_set_cr3[], g_cr3[], g_invlpg[], g_read[], g_end[];
asm(".pushsection .rodata\n"
    "g_begin:\n"
    "g_pte_mov: mov %rdi, (%rsi); out %al, $0x10\n"
    "g_pte_stosq: mov %rdi, %rax; mov %rsi, %rdi; mov $1, %rcx; rep stosq; out %al, $0x10\n"
    "g_page_stosb: mov %rsi, %rdi; xor %eax, %eax; mov $4096, %rcx; rep stosb; out %al, $0x10\n"
    "g_page_movsb: mov $4096, %rcx; rep movsb; out %al, $0x10\n"
    "g_set_cr3: mov %rdi, %cr3; out %al, $0x10\n"
    "g_cr3: mov %cr3, %rax; mov %rax, %cr3; out %al, $0x10\n"
    "g_invlpg: invlpg 0x200000; out %al, $0x10\n"
    "g_read: mov 0x200000, %rax; out %al, $0x10\n"
    "g_end:\n"
    ".popsection\n");

#define MEM_SIZE 0x400000ul
#define CODE 0x10000ul
#define PML4 0x1000ul
#define PT2 0x6000ul    // the table mapping 0x200000-0x3fffff
#define PML4_B 0x21000ul // a root image whose tables map 0x200000 to B
#define PAGE_A 0x300000ul
#define PAGE_B 0x301000ul
#define A_WORD 0xaaaaaaaaaaaaaaaaul
#define B_WORD 0xbbbbbbbbbbbbbbbbul
#define FAULTED 1ul // what a read that faulted (triple fault: no IDT) returns

static int kvm, vm, vcpu;
static struct kvm_run *run;
static uint8_t *mem;
#define Q(a) ((uint64_t *)(mem + (a)))
#define AT(label) (CODE + (uint64_t)((label) - g_begin))

static void die(const char *what) { perror(what); exit(2); }

static void vm_new(void) {
  if ((kvm = open("/dev/kvm", O_RDWR | O_CLOEXEC)) < 0) die("/dev/kvm");
  if ((vm = ioctl(kvm, KVM_CREATE_VM, 0)) < 0) die("KVM_CREATE_VM");
  mem = mmap(0, MEM_SIZE, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  struct kvm_userspace_memory_region r = {.slot = 0, .memory_size = MEM_SIZE, .userspace_addr = (uint64_t)mem};
  if (ioctl(vm, KVM_SET_USER_MEMORY_REGION, &r) < 0) die("KVM_SET_USER_MEMORY_REGION");
  // PML4 -> PDPT 0x2000 -> PD 0x3000: [0] identity-maps 0-2 MiB in 4 KiB pages (user,
  // writable: CPL3 can write PT2 through 0x6000), [1] is PT2, whose entry 0 maps A.
  Q(PML4)[0] = 0x2007; Q(0x2000)[0] = 0x3007; Q(0x3000)[0] = 0x5007; Q(0x3000)[1] = PT2 | 7;
  for (uint64_t i = 0; i < 512; i++) Q(0x5000)[i] = (i << 12) | 7;
  Q(PT2)[0] = PAGE_A | 7;
  // Another root's image: PDPT 0x22000 -> PD 0x23000 -> [1] = PT 0x24000 mapping B.
  Q(PML4_B)[0] = 0x22007; Q(0x22000)[0] = 0x23007; Q(0x23000)[0] = 0x5007; Q(0x23000)[1] = 0x24007;
  Q(0x24000)[0] = PAGE_B | 7;
  memcpy(mem + 0x30000, mem + PML4, 0x1000); // a second process's root, like the first
  memset(mem + PAGE_A, 0xaa, 0x1000); memset(mem + PAGE_B, 0xbb, 0x1000);
  memcpy(mem + CODE, g_begin, g_end - g_begin);
  if ((vcpu = ioctl(vm, KVM_CREATE_VCPU, 0)) < 0) die("KVM_CREATE_VCPU");
  run = mmap(0, ioctl(kvm, KVM_GET_VCPU_MMAP_SIZE, 0), PROT_READ | PROT_WRITE, MAP_SHARED, vcpu, 0);
  struct { struct kvm_cpuid2 c; struct kvm_cpuid_entry2 e[100]; } cpuid = {.c.nent = 100};
  if (ioctl(kvm, KVM_GET_SUPPORTED_CPUID, &cpuid) < 0 || ioctl(vcpu, KVM_SET_CPUID2, &cpuid) < 0) die("CPUID");
  struct kvm_sregs s;
  if (ioctl(vcpu, KVM_GET_SREGS, &s) < 0) die("KVM_GET_SREGS");
  s.cr3 = PML4; s.cr4 = 0x6a0; s.cr0 = 0x80010033; s.efer = 0x500; // PAE PGE OSFXSR; PG WP; LME LMA
  if (ioctl(vcpu, KVM_SET_SREGS, &s) < 0) die("KVM_SET_SREGS");
}

static void vm_free(void) { close(vcpu); close(vm); close(kvm); munmap(mem, MEM_SIZE); }

// Runs one step at CPL `cpl`; returns RAX after it, or FAULTED.
static uint64_t step(uint64_t rip, int cpl, uint64_t rdi, uint64_t rsi) {
  struct kvm_sregs s;
  if (ioctl(vcpu, KVM_GET_SREGS, &s) < 0) die("KVM_GET_SREGS");
  struct kvm_segment seg = {.limit = 0xffffffff, .selector = cpl ? 0x1b : 8, .present = 1, .type = 11,
                            .dpl = cpl, .s = 1, .l = 1, .g = 1};
  s.cs = seg;
  seg.type = 3; seg.selector = cpl ? 0x23 : 16; seg.l = 0; seg.db = 1;
  s.ds = s.es = s.fs = s.gs = s.ss = seg;
  if (ioctl(vcpu, KVM_SET_SREGS, &s) < 0) die("KVM_SET_SREGS");
  struct kvm_regs r = {.rip = rip, .rflags = 0x3002 /* IOPL 3: CPL3 may `out` */, .rsp = 0x8000, .rdi = rdi, .rsi = rsi};
  if (ioctl(vcpu, KVM_SET_REGS, &r) < 0) die("KVM_SET_REGS");
  if (ioctl(vcpu, KVM_RUN, 0) < 0) die("KVM_RUN");
  if (run->exit_reason != KVM_EXIT_IO || run->io.port != 0x10) return FAULTED;
  if (ioctl(vcpu, KVM_GET_REGS, &r) < 0) die("KVM_GET_REGS");
  return r.rax;
}

static void zap_by_memslot(void) {
  void *page = mmap(0, 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  struct kvm_userspace_memory_region r = {.slot = 5, .guest_phys_addr = 1ul << 38, .memory_size = 4096,
                                          .userspace_addr = (uint64_t)page};
  if (ioctl(vm, KVM_SET_USER_MEMORY_REGION, &r) < 0) die("add a memslot");
  r.memory_size = 0;
  if (ioctl(vm, KVM_SET_USER_MEMORY_REGION, &r) < 0) die("delete a memslot");
  munmap(page, 4096);
}

enum { MOV, STOSQ, CPL3_MOV, MOVSB_TABLE, STOSB_ZERO, OLD_ROOT, VMM_WRITE, VMM_WRITE_ZAP, CASES };
static const char *names[CASES] = {
    [MOV] = "PTE rewritten at CPL0 by mov",
    [STOSQ] = "PTE rewritten at CPL0 by rep stosq",
    [CPL3_MOV] = "PTE rewritten at CPL3 by mov (user mapping of the table)",
    [MOVSB_TABLE] = "table page copied over at CPL0 by rep movsb",
    [STOSB_ZERO] = "table page zeroed at CPL0 by rep stosb (a fault wanted)",
    [OLD_ROOT] = "root rewritten while a cached previous root, then loaded",
    [VMM_WRITE] = "control: PTE rewritten by the VMM (stale on any KVM)",
    [VMM_WRITE_ZAP] = "control: the same, then a memslot deleted",
};

int main(void) {
  const char *flushes[] = {"mov cr3", "invlpg"};
  uint64_t flush_at[] = {AT(g_cr3), AT(g_invlpg)};
  int stale = 0;
  for (int f = 0; f < 2; f++) {
    for (int c = 0; c < CASES; c++) {
      vm_new();
      uint64_t first = step(AT(g_read), 3, 0, 0), want = c == STOSB_ZERO ? FAULTED : B_WORD;
      switch (c) {
      case MOV: step(AT(g_pte_mov), 0, PAGE_B | 7, PT2); break;
      case STOSQ: step(AT(g_pte_stosq), 0, PAGE_B | 7, PT2); break;
      case CPL3_MOV: step(AT(g_pte_mov), 3, PAGE_B | 7, PT2); break;
      case MOVSB_TABLE: memcpy(mem + 0x7000, mem + 0x24000, 0x1000); step(AT(g_page_movsb), 0, PT2, 0x7000); break;
      case STOSB_ZERO: step(AT(g_page_stosb), 0, 0, PT2); break;
      case OLD_ROOT: // another process runs, this root is rewritten (zeroed, then B's image), then loaded again
        step(AT(g_set_cr3), 0, 0x30000, 0); step(AT(g_read), 3, 0, 0);
        step(AT(g_page_stosb), 0, 0, PML4); step(AT(g_page_movsb), 0, PML4, PML4_B);
        step(AT(g_set_cr3), 0, PML4, 0);
        break;
      case VMM_WRITE: Q(PT2)[0] = PAGE_B | 7; break;
      case VMM_WRITE_ZAP: Q(PT2)[0] = PAGE_B | 7; zap_by_memslot(); break;
      }
      step(flush_at[f], 0, 0, 0);
      uint64_t then = step(AT(g_read), 3, 0, 0);
      int ok = first == A_WORD && then == want;
      if (!ok && c != VMM_WRITE) stale++;
      printf("%-58s flush by %-7s: %s\n", names[c], flushes[f],
             first != A_WORD ? "the first read did not see A" : ok ? "fresh" : then == A_WORD ? "STALE (still A)" : "wrong");
      vm_free();
    }
  }
  printf("host-shadow-probe: %d case(s) stale\n", stale);
  return stale != 0;
}
