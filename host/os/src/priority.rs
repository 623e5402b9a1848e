/// Lowers the calling thread's scheduling priority by `nice` steps (Linux:
/// per-thread `setpriority`). For threads whose work must never delay the
/// node's I/O threads: under contention the kernel hands a nice-10 thread
/// about a tenth of what a nice-0 thread gets, and all of an idle core.
///
/// Best effort: a failure leaves the thread as it was and is returned.
pub fn lower_thread_priority(nice: i32) -> std::io::Result<()> {
    #[cfg(target_os = "linux")]
    {
        // SAFETY: `gettid` has no preconditions and cannot fail.
        let tid = unsafe { libc::gettid() };
        // SAFETY: `setpriority` reads only its integer arguments; a thread
        // id of this process is a valid `PRIO_PROCESS` target on Linux.
        let rc = unsafe { libc::setpriority(libc::PRIO_PROCESS, tid as libc::id_t, nice) };
        if rc != 0 {
            return Err(std::io::Error::last_os_error());
        }
    }
    #[cfg(not(target_os = "linux"))]
    let _ = nice;
    Ok(())
}
