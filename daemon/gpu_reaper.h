/*
 * The GPU reaper: one worker thread that runs the driver calls which free
 * GPU memory (cuMemFree synchronizes the device, cuMemRelease and hipFree
 * may wait for it, and dropping a primary context tears it down), so that
 * the loop thread never waits for them. Jobs run in the order they were
 * queued. The backends queue them from release(); nothing waits for a job
 * except gpu_reaper_drain().
 *
 * Freeing after release() returns is safe for every GPU path: release() is
 * only called once the tensor's last lease is gone, so no client still has
 * the memory open (legacy IPC), and VMM memory is refcounted by the driver.
 */
#ifndef TENSORD_GPU_REAPER_H
#define TENSORD_GPU_REAPER_H

/*
 * Queues fn(arg) for the worker, starting it on first use. Takes ownership
 * of arg, which fn must free. If no thread or no memory can be had, runs
 * fn(arg) here and now: a free must never be lost.
 */
void gpu_reaper_run(void (*fn)(void *arg), void *arg);

/* Waits until every job queued so far has run. Any thread but the worker. */
void gpu_reaper_drain(void);

/* Runs what is queued, then stops the worker (a later run starts it again). */
void gpu_reaper_stop(void);

#endif /* TENSORD_GPU_REAPER_H */
