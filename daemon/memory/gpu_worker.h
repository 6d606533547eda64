/*
 * The GPU worker: one thread that runs the driver calls which may block,
 * so that the loop thread never waits for the device. It frees (cuMemFree synchronizes the device, cuMemRelease and
 * hipFree may wait for it, and dropping a primary context tears it down)
 * and it allocates (retaining a primary context takes hundreds of
 * milliseconds, cuMemCreate and hipMalloc may wait, and zeroing the memory
 * synchronizes). Jobs run one at a time, in the order they were queued, so
 * a backend's per-device state needs no lock when only jobs touch it.
 *
 * A job may have a completion, done(arg), which runs on the thread that
 * calls gpu_worker_complete() (the daemon's loop, woken by the notify hook)
 * after fn(arg) returned. Jobs without one are fire-and-forget.
 *
 * Freeing after release() returns is safe for every GPU path: release() is
 * only called once the tensor's last lease is gone, so no client still has
 * the memory open (legacy IPC), and VMM memory is refcounted by the driver.
 */
#ifndef TENSORD_GPU_WORKER_H
#define TENSORD_GPU_WORKER_H

#include <stdint.h>

/*
 * Queues fn(arg) for the worker, starting it on first use. Takes ownership
 * of arg, which fn must free. If no thread or no memory can be had, runs
 * fn(arg) here and now: a free must never be lost.
 */
void gpu_worker_run(void (*fn)(void *arg), void *arg);

/*
 * A timer: queues fn(arg) for the worker once delay_ns have passed
 * (gpu_worker_now_ns()), behind whatever was queued by then; it runs on the
 * worker like any job, so what it does needs no more care than a job.
 * The worker sleeps until the soonest timer. gpu_worker_drain() does not
 * wait for timers, and gpu_worker_stop() drops those not yet due without
 * running them: arg stays the caller's (fn must not free it) and must
 * need nothing done at the stop that the caller does not do itself.
 * 0, or -ENOMEM or -EAGAIN (no thread) when nothing was queued.
 */
int gpu_worker_run_after(uint64_t delay_ns, void (*fn)(void *arg), void *arg);

/* Now on the clock the timers go by: CLOCK_MONOTONIC ns, or a test's. */
uint64_t gpu_worker_now_ns(void);

/*
 * Times the timers (and whatever reads gpu_worker_now_ns(): the GPU
 * backends' context hold) by now_ns() instead of CLOCK_MONOTONIC: a test's
 * clock, which moves only when the test says. The timers due by now_ns()
 * join the queue at once (gpu_worker_drain() then waits for them); call it
 * again each time the clock moved. NULL: CLOCK_MONOTONIC again.
 */
void gpu_worker_set_clock(uint64_t (*now_ns)(void));

/*
 * Queues fn(arg) for the worker, then done(arg) for gpu_worker_complete().
 * arg is the caller's until done runs. Never runs done here: if no thread
 * can be had, fn runs here and done waits for gpu_worker_complete() all the
 * same, so a caller may finish setting up after this returns. -ENOMEM when
 * nothing was queued (neither fn nor done will run).
 */
int gpu_worker_submit(void (*fn)(void *arg), void (*done)(void *arg), void *arg);

/*
 * Called on the worker's thread each time a job with a completion finished,
 * with the worker's lock held (so it must be quick and call nothing here:
 * uv_async_send, which wakes the loop). NULL: nobody is told; then only a
 * call to gpu_worker_complete() runs completions. Once this returns, the
 * old hook is never called again.
 */
void gpu_worker_set_notify(void (*notify)(void *ctx), void *ctx);

/* Runs the completions of every finished job, in order. Returns how many ran. */
unsigned gpu_worker_complete(void);

/* Waits until every job queued so far has run (not the timers not yet due). Any thread but the worker. */
void gpu_worker_drain(void);

/*
 * Runs what is queued (and the timers due by then), then stops the worker
 * and drops the timers not yet due (a later run starts it again).
 */
void gpu_worker_stop(void);

#endif /* TENSORD_GPU_WORKER_H */
