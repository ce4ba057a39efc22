/*
 * Futex calls on 32-bit words of shared memory: wait, wake, and wait on many
 * words at once. Addresses arrive as integers (uintptr_t); kickmsg/atomics.py
 * is the one Python door to these functions. cffi releases the GIL around
 * every call, so a thread asleep in one never holds it.
 */
#include <errno.h>
#include <linux/futex.h>
#include <stdint.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

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
