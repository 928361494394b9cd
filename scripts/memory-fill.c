/* Touches MiB of fresh anonymous memory from user space (each page written once: the
 * guest kernel zeroes it on the fault), prints "touched-<MiB>-in-<ms>", then exits,
 * freeing it all at once; a second argument holds it that many seconds first (a timed
 * hold: no input the console could lose). scripts/linux-memory.sh's guest fills memory with it: a dd into
 * tmpfs copies at CPL0, which this nested host emulates instruction by instruction. */
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

int main(int argc, char **argv) {
    long mib = argc > 1 ? atol(argv[1]) : 0;
    if (mib <= 0) {
        fprintf(stderr, "usage: memory-fill MiB\n");
        return 2;
    }
    size_t len = (size_t)mib << 20;
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    /* 2 MiB aligned and advised huge: one fault per 2 MiB where the kernel has THP. */
    char *raw = mmap(NULL, len + (2 << 20), PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (raw == MAP_FAILED) {
        perror("mmap");
        return 1;
    }
    volatile char *p = (char *)(((unsigned long)raw + (2 << 20) - 1) & ~((2UL << 20) - 1));
    madvise((void *)p, len, MADV_HUGEPAGE);
    for (size_t at = 0; at < len; at += 4096)
        p[at] = 1;
    clock_gettime(CLOCK_MONOTONIC, &t1);
    long ms = (t1.tv_sec - t0.tv_sec) * 1000 + (t1.tv_nsec - t0.tv_nsec) / 1000000;
    printf("touched-%ld-in-%ld\n", mib, ms);
    fflush(stdout);
    if (argc > 2)
        sleep((unsigned)atoi(argv[2]));
    return 0;
}
