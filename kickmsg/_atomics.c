/*
 * The only C in kickmsg: atomic operations on 32- and 64-bit words of shared
 * memory, each with its memory order fixed in its name, and a futex wait/wake
 * pair. Addresses arrive as integers (uintptr_t); kickmsg/atomics.py is the
 * one Python door to these functions. cffi releases the GIL around every
 * call, so a thread blocked in km_futex_wait never holds it.
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
#include <errno.h>
#include <linux/futex.h>
#include <stdint.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

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

/* Outcomes of km_futex_wait. */
#define KM_FUTEX_WOKEN 0         /* woken by a wake call (or spuriously) */
#define KM_FUTEX_TIMED_OUT 1     /* the relative timeout elapsed */
#define KM_FUTEX_VALUE_CHANGED 2 /* *addr != expected when the call began */
#define KM_FUTEX_INTERRUPTED 3   /* a signal arrived; the caller re-checks */

/* The KM_FUTEX_* outcome of a futex call that failed with this errno. */
static int km_futex_failure(int error)
{
    switch (error) {
    case ETIMEDOUT: return KM_FUTEX_TIMED_OUT;
    case EAGAIN: return KM_FUTEX_VALUE_CHANGED;
    case EINTR: return KM_FUTEX_INTERRUPTED;
    default: return -error;
    }
}

/*
 * Sleep while the 32-bit word at addr equals expected, at most timeout_ns
 * (negative: no limit). Shared (not PRIVATE) futex, so waiters and wakers
 * may live in different processes. Returns a KM_FUTEX_* outcome or -errno.
 */
int km_futex_wait(uintptr_t addr, uint32_t expected, int64_t timeout_ns)
{
    struct timespec timeout;
    struct timespec *timeout_or_null = NULL;
    if (timeout_ns >= 0) {
        timeout.tv_sec = (time_t)(timeout_ns / 1000000000);
        timeout.tv_nsec = (long)(timeout_ns % 1000000000);
        timeout_or_null = &timeout;
    }
    if (syscall(SYS_futex, (uint32_t *)addr, FUTEX_WAIT, expected,
                timeout_or_null, NULL, 0) == 0)
        return KM_FUTEX_WOKEN;
    return km_futex_failure(errno);
}

/* Wake every process and thread sleeping on the word at addr; returns how
 * many were woken, or -errno. */
int km_futex_wake_all(uintptr_t addr)
{
    long woken = syscall(SYS_futex, (uint32_t *)addr, FUTEX_WAKE, INT32_MAX,
                         NULL, NULL, 0);
    return woken >= 0 ? (int)woken : -errno;
}

/* -- futex_waitv: sleeping on many words at once ----------------------------
 *
 * The kernel's struct futex_waitv and the flag of a 32-bit word (Linux 5.16,
 * <linux/futex.h>), spelled out so that older headers build too. The system
 * call has the same number on every architecture.
 */
struct km_futex_waitv {
    uint64_t value;
    uint64_t address;
    uint32_t flags;
    uint32_t reserved;
};
#define KM_FUTEX2_SIZE_U32 0x02
#define KM_FUTEX_WAITV_MAX 128 /* the kernel's limit per call */
#ifndef SYS_futex_waitv
#define SYS_futex_waitv 449
#endif

/*
 * Sleep while each 32-bit word at addresses[i] equals expected[i] (i <
 * count <= KM_FUTEX_WAITV_MAX), at most timeout_ns (negative: no limit; the
 * kernel wants an absolute CLOCK_MONOTONIC time, made here). Shared futexes,
 * as km_futex_wait. Returns a KM_FUTEX_* outcome or -errno (-ENOSYS: a
 * kernel before 5.16). *woken_index is the index of the word whose wake-up
 * ended the sleep (KM_FUTEX_WOKEN), else -1.
 */
int km_futex_waitv(const uintptr_t *addresses, const uint32_t *expected,
                   uint32_t count, int64_t timeout_ns, int32_t *woken_index)
{
    struct km_futex_waitv waiters[KM_FUTEX_WAITV_MAX];
    struct timespec deadline;
    struct timespec *deadline_or_null = NULL;
    long woken;
    uint32_t i;

    *woken_index = -1;
    if (count == 0 || count > KM_FUTEX_WAITV_MAX)
        return -EINVAL;
    for (i = 0; i < count; i++) {
        waiters[i].value = expected[i];
        waiters[i].address = addresses[i];
        waiters[i].flags = KM_FUTEX2_SIZE_U32;
        waiters[i].reserved = 0;
    }
    if (timeout_ns >= 0) {
        clock_gettime(CLOCK_MONOTONIC, &deadline);
        deadline.tv_sec += (time_t)(timeout_ns / 1000000000);
        deadline.tv_nsec += (long)(timeout_ns % 1000000000);
        if (deadline.tv_nsec >= 1000000000) {
            deadline.tv_sec += 1;
            deadline.tv_nsec -= 1000000000;
        }
        deadline_or_null = &deadline;
    }
    woken = syscall(SYS_futex_waitv, waiters, count, 0, deadline_or_null,
                    CLOCK_MONOTONIC);
    if (woken >= 0) {
        *woken_index = (int32_t)woken;
        return KM_FUTEX_WOKEN;
    }
    return km_futex_failure(errno);
}
