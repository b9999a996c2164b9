/*
 * heap_trim: how much free memory a daemon's malloc arenas keep before they
 * give it back to the kernel. glibc trims a thread's arena as soon as its
 * free top passes 128 KiB, and SQLite frees about that much at the end of
 * many statements: each create then paid an madvise() and a TLB shootdown
 * that interrupts the other CPU (a tenth of ferry-mountd's time in a
 * create storm). Keeping up to 2 MiB per arena costs little memory.
 *
 * Setting the trim threshold also stops glibc from raising its mmap
 * threshold as it sees large blocks freed, so every allocation of 128 KiB
 * or more (a READ's reply buffer) was an mmap, page faults and a munmap
 * with another TLB shootdown: blocks up to 1 MiB come from the arenas.
 */
#ifndef FERRY_HEAP_TRIM_H
#define FERRY_HEAP_TRIM_H

/* Arenas keep up to 2 MiB free and serve blocks up to 1 MiB, unless
 * MALLOC_TRIM_THRESHOLD_ or MALLOC_MMAP_THRESHOLD_ says otherwise (glibc's
 * own settings win). */
void heap_trim_threshold_raise(void);

#endif
