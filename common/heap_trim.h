/*
 * heap_trim: how much free memory a daemon's malloc arenas keep before they
 * give it back to the kernel. glibc trims a thread's arena as soon as its
 * free top passes 128 KiB, and SQLite frees about that much at the end of
 * many statements: each create then paid an madvise() and a TLB shootdown
 * that interrupts the other CPU (a tenth of ferry-mountd's time in a
 * create storm). Keeping up to a MiB per arena costs little memory.
 */
#ifndef FERRY_HEAP_TRIM_H
#define FERRY_HEAP_TRIM_H

/* Arenas keep up to 1 MiB free, unless MALLOC_TRIM_THRESHOLD_ says
 * otherwise (glibc's own setting wins). */
void heap_trim_threshold_raise(void);

#endif
