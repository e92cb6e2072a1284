//! This process's resident memory (Linux `/proc/self/status`), for benchmark reports.

/// A `/proc/self/status` field in kB (`VmHWM`, `VmRSS`), as MB; 0 where it cannot be read.
fn status_mb(field: &str) -> f64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with(field))
                .and_then(|l| l.split_whitespace().nth(1).and_then(|kb| kb.parse::<f64>().ok()))
        })
        .map_or(0.0, |kb| kb / 1024.0)
}

/// Peak resident memory (`VmHWM`), MB.
pub fn peak_rss_mb() -> f64 {
    status_mb("VmHWM:")
}

/// Resets this process's peak (`VmHWM`) to its current RSS (Linux: `clear_refs` 5), so a
/// phase's peak is not a loading transient's; false where the kernel does not allow it.
pub fn reset_peak() -> bool {
    std::fs::write("/proc/self/clear_refs", "5").is_ok()
}

/// Resident memory of this process now (`VmRSS`), MB.
pub fn rss_mb() -> f64 {
    status_mb("VmRSS:")
}
