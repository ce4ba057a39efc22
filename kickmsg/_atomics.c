/*
 * Atomic operations on 32- and 64-bit words of shared memory, each with its
 * memory order fixed in its name (the futex calls are in _futex.c).
 * Addresses arrive as integers (uintptr_t); kickmsg/atomics.py is the one
 * Python door to these functions. None of them blocks, so they are called
 * holding the GIL (kickmsg/_build.py says how).
 *
 * CAS functions are strong and return the value they found: the exchange
 * happened exactly when that value equals `expected`. A failed CAS reads
 * with the success order minus its release part (acq_rel fails acquire,
 * release fails relaxed, seq_cst fails seq_cst).
 *
 * Every read-modify-write exists in each order a flow or a mutant needs, so
 * that any order can be weakened one step by editing one call (`kickmsg
 * verify --orders`).
 */
#include <stdint.h>

#define KM_LOAD(T, SUFFIX, ORDER_NAME, ORDER)                                  \
    T km_load_##ORDER_NAME##_##SUFFIX(uintptr_t addr)                          \
    {                                                                          \
        return __atomic_load_n((T *)addr, ORDER);                              \
    }

#define KM_STORE(T, SUFFIX, ORDER_NAME, ORDER)                                 \
    void km_store_##ORDER_NAME##_##SUFFIX(uintptr_t addr, T value)             \
    {                                                                          \
        __atomic_store_n((T *)addr, value, ORDER);                             \
    }

#define KM_CAS(T, SUFFIX, ORDER_NAME, SUCCESS_ORDER, FAILURE_ORDER)            \
    T km_cas_##ORDER_NAME##_##SUFFIX(uintptr_t addr, T expected, T desired)    \
    {                                                                          \
        __atomic_compare_exchange_n((T *)addr, &expected, desired, 0,          \
                                    SUCCESS_ORDER, FAILURE_ORDER);             \
        return expected;                                                       \
    }

#define KM_FETCH(T, SUFFIX, OP, ORDER_NAME, ORDER)                             \
    T km_fetch_##OP##_##ORDER_NAME##_##SUFFIX(uintptr_t addr, T operand)       \
    {                                                                          \
        return __atomic_fetch_##OP((T *)addr, operand, ORDER);                 \
    }

#define KM_ALL_OPS(T, SUFFIX)                                                  \
    KM_LOAD(T, SUFFIX, relaxed, __ATOMIC_RELAXED)                              \
    KM_LOAD(T, SUFFIX, acquire, __ATOMIC_ACQUIRE)                              \
    KM_STORE(T, SUFFIX, relaxed, __ATOMIC_RELAXED)                             \
    KM_STORE(T, SUFFIX, release, __ATOMIC_RELEASE)                             \
    KM_STORE(T, SUFFIX, seq_cst, __ATOMIC_SEQ_CST)                             \
    KM_CAS(T, SUFFIX, relaxed, __ATOMIC_RELAXED, __ATOMIC_RELAXED)             \
    KM_CAS(T, SUFFIX, acquire, __ATOMIC_ACQUIRE, __ATOMIC_ACQUIRE)             \
    KM_CAS(T, SUFFIX, release, __ATOMIC_RELEASE, __ATOMIC_RELAXED)             \
    KM_CAS(T, SUFFIX, acq_rel, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE)             \
    KM_CAS(T, SUFFIX, seq_cst, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST)             \
    KM_FETCH(T, SUFFIX, add, relaxed, __ATOMIC_RELAXED)                        \
    KM_FETCH(T, SUFFIX, add, acquire, __ATOMIC_ACQUIRE)                        \
    KM_FETCH(T, SUFFIX, add, release, __ATOMIC_RELEASE)                        \
    KM_FETCH(T, SUFFIX, add, acq_rel, __ATOMIC_ACQ_REL)                        \
    KM_FETCH(T, SUFFIX, sub, relaxed, __ATOMIC_RELAXED)                        \
    KM_FETCH(T, SUFFIX, sub, acquire, __ATOMIC_ACQUIRE)                        \
    KM_FETCH(T, SUFFIX, sub, release, __ATOMIC_RELEASE)                        \
    KM_FETCH(T, SUFFIX, sub, acq_rel, __ATOMIC_ACQ_REL)

KM_ALL_OPS(uint32_t, u32)
KM_ALL_OPS(uint64_t, u64)

/* A fence orders this thread's accesses to every word around it (layout 9's
 * Dekker pairs: the waiter's has_waiter store, the publisher's commit). */
void km_fence_seq_cst(void)
{
    __atomic_thread_fence(__ATOMIC_SEQ_CST);
}

/* A run of relaxed loads in one call: the words `stride` bytes apart from
 * `addr`, indices `start` to `count` - 1, each read on its own (relaxed,
 * as km_load_relaxed_u32 reads it) until one of them, masked with `mask`,
 * equals `value`. Returns that index << 32 | the word read, or -1 if none
 * did (a publisher's pre-check of the rings' states: the next Live one). */
int64_t km_find_relaxed_u32(uintptr_t addr, uintptr_t stride, uint32_t start, uint32_t count, uint32_t mask,
                            uint32_t value)
{
    for (uint32_t index = start; index < count; index++) {
        uint32_t word = __atomic_load_n((uint32_t *)(addr + (uintptr_t)index * stride), __ATOMIC_RELAXED);
        if ((word & mask) == value) {
            return (int64_t)index << 32 | word;
        }
    }
    return -1;
}
