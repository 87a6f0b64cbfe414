//! The server's clock: wall-clock time, unless a caller fixed the moment for the task it runs
//! in ([`at`]). Every figure that depends on "now" (what is under way, what has closed, how
//! old a kept section is) reads it here, so a test can view the same data at several moments
//! (first view, after the job, after the month closes) and compare what each view served.

use std::future::Future;

tokio::task_local! {
    static FIXED_MS: i64;
}

/// Epoch milliseconds: the moment fixed for this task, else the wall clock.
pub fn now_ms() -> i64 {
    FIXED_MS
        .try_with(|ms| *ms)
        .unwrap_or_else(|_| chrono::Utc::now().timestamp_millis())
}

/// Runs `f` with the clock fixed at `ms` for it (and only it: tasks it spawns read the wall
/// clock).
pub async fn at<F: Future>(ms: i64, f: F) -> F::Output {
    FIXED_MS.scope(ms, f).await
}

#[cfg(test)]
mod tests {
    #[tokio::test]
    async fn a_fixed_moment_holds_for_its_task_alone() {
        let wall = super::now_ms();
        assert!(wall > 1_700_000_000_000, "{wall}");
        let fixed = super::at(42, async { (super::now_ms(), super::now_ms()) }).await;
        assert_eq!(fixed, (42, 42));
        assert!(super::now_ms() >= wall, "the wall clock again outside");
        let spawned = super::at(42, async { tokio::spawn(async { super::now_ms() }).await })
            .await
            .unwrap();
        assert!(spawned >= wall, "a spawned task reads the wall clock");
    }
}
