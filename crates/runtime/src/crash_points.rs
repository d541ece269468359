//! Named crash points, compiled in with the `failpoints` feature (the
//! integration tests' build only). Each `fail_point!("op.step")` in the
//! daemon, the blob store and the snapshot code marks a durable step after
//! which a crash must leave the store consistent; docs/testing.md lists
//! them. A daemon started with `CAIRN_CRASH_AT=op.step` kills itself with
//! SIGKILL the first time it reaches that step, after one line on stderr
//! that tells the test the kill landed there. One started with
//! `CAIRN_PAUSE_AT=op.step:MS` sleeps MS milliseconds there instead (a
//! test's window to act while the step is under way).

/// Arms the point named by `CAIRN_CRASH_AT`, and the pause of
/// `CAIRN_PAUSE_AT`, if any.
pub fn arm_from_env() {
    if let Ok(pause) = std::env::var("CAIRN_PAUSE_AT") {
        match pause.split_once(':').map(|(n, ms)| (n, ms.parse::<u64>())) {
            Some((name, Ok(ms))) => match fail::cfg(name, &format!("sleep({ms})")) {
                Ok(()) => tracing::warn!("pause point {name} armed: the daemon sleeps {ms} ms there"),
                Err(e) => tracing::error!("pause point {name}: {e}"),
            },
            _ => tracing::error!("CAIRN_PAUSE_AT={pause}: expected op.step:MILLISECONDS"),
        }
    }
    let Ok(name) = std::env::var("CAIRN_CRASH_AT") else { return };
    let point = name.clone();
    let armed = fail::cfg_callback(name.clone(), move || {
        use std::io::Write;
        // stderr is unbuffered: the line is written before the kill.
        let _ = writeln!(std::io::stderr(), "crash point {point} reached: killing the daemon");
        // SAFETY: kill(2) on our own pid with a constant signal; no memory
        // is involved.
        unsafe { libc::kill(libc::getpid(), libc::SIGKILL) };
    });
    match armed {
        Ok(()) => tracing::warn!("crash point {name} armed: the daemon kills itself when it gets there"),
        Err(e) => tracing::error!("crash point {name}: {e}"),
    }
}
