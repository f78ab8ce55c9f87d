/*
 * Why this exists: the baseline the simulator benchmark compares `iocache sim`
 * against (issue 14 section 2). It is the smallest honest LRU cache simulator:
 * it parses an ARC/UMass ".lis" trace (`start_block num_blocks ignored
 * request_no`, 512-byte blocks), expands each request into one access per
 * cache line, and keeps an LRU of CAPACITY lines in a chained hash map plus a
 * doubly linked list. It counts hits only: no op lists, no bitmaps, no dirty
 * state. Lines are 512 bytes, the same size as a trace block, so every access
 * is a whole-line access and a hit is a full hit, as in the simulator.
 *
 * Usage: lru-baseline [CAPACITY_LINES] < trace.lis
 *   (default 131072 lines; reads the whole decompressed text from stdin)
 * Prints: accesses, hits, misses and the hit ratio.
 *
 * Build: gcc -O2 -o lru-baseline scripts/bench/lru-baseline.c
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* One cached line: its key (block number), hash-chain and LRU links. */
struct entry {
    uint64_t key;
    struct entry *chain; /* next entry in the same hash bucket */
    struct entry *prev;  /* towards the most recently used end */
    struct entry *next;  /* towards the least recently used end */
};

static struct entry **buckets;
static uint64_t bucket_mask;
static struct entry head; /* sentinel: head.next is the MRU, head.prev the LRU */

static inline uint64_t bucket_of(uint64_t key) {
    key *= 0x9E3779B97F4A7C15ULL; /* Fibonacci hashing */
    return (key >> 32) & bucket_mask;
}

static inline void unlink_entry(struct entry *e) {
    e->prev->next = e->next;
    e->next->prev = e->prev;
}

static inline void push_front(struct entry *e) {
    e->next = head.next;
    e->prev = &head;
    head.next->prev = e;
    head.next = e;
}

int main(int argc, char **argv) {
    uint64_t capacity = argc > 1 ? strtoull(argv[1], NULL, 10) : 131072;
    if (capacity == 0) {
        fprintf(stderr, "capacity must be above 0\n");
        return 2;
    }
    uint64_t nbuckets = 1;
    while (nbuckets < capacity * 2)
        nbuckets <<= 1;
    bucket_mask = nbuckets - 1;
    buckets = calloc(nbuckets, sizeof *buckets);
    struct entry *pool = calloc(capacity, sizeof *pool);
    if (!buckets || !pool) {
        fprintf(stderr, "out of memory\n");
        return 2;
    }
    head.next = head.prev = &head;
    uint64_t used = 0, accesses = 0, hits = 0;

    static char buf[1 << 20];
    size_t have = 0;
    int at_eof = 0;
    /* Fields of the line being parsed: which field, and the first two values. */
    int field = 0, in_number = 0;
    uint64_t value = 0, start = 0, count = 0;
    for (;;) {
        ssize_t got = read(0, buf, sizeof buf);
        if (got < 0) {
            perror("read");
            return 2;
        }
        if (got == 0) {
            at_eof = 1;
            buf[0] = '\n'; /* finish a last line without a newline */
            have = 1;
        } else {
            have = (size_t)got;
        }
        for (size_t i = 0; i < have; i++) {
            char c = buf[i];
            if (c >= '0' && c <= '9') {
                value = value * 10 + (uint64_t)(c - '0');
                in_number = 1;
                continue;
            }
            if (in_number) {
                if (field == 0)
                    start = value;
                else if (field == 1)
                    count = value;
                field++;
                value = 0;
                in_number = 0;
            }
            if (c != '\n')
                continue;
            if (field >= 2) {
                for (uint64_t block = start; block < start + count; block++) {
                    accesses++;
                    uint64_t b = bucket_of(block);
                    struct entry *e = buckets[b];
                    while (e && e->key != block)
                        e = e->chain;
                    if (e) {
                        hits++;
                        unlink_entry(e);
                        push_front(e);
                        continue;
                    }
                    if (used < capacity) {
                        e = &pool[used++];
                    } else {
                        e = head.prev; /* evict the least recently used */
                        unlink_entry(e);
                        struct entry **p = &buckets[bucket_of(e->key)];
                        while (*p != e)
                            p = &(*p)->chain;
                        *p = e->chain;
                    }
                    e->key = block;
                    e->chain = buckets[b];
                    buckets[b] = e;
                    push_front(e);
                }
            }
            field = 0;
        }
        if (at_eof)
            break;
    }
    printf("accesses %llu\nhits %llu\nmisses %llu\nhit_ratio %.4f\n", (unsigned long long)accesses,
           (unsigned long long)hits, (unsigned long long)(accesses - hits),
           accesses ? (double)hits / (double)accesses : 0.0);
    return 0;
}
