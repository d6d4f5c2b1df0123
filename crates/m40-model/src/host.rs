//! The host's memory: what is available to this process, so that a CPU
//! backend too large for the machine is an error before anything is
//! allocated, never an abort halfway.

/// Bytes this process may still allocate: the kernel's `MemAvailable`,
/// lowered to what a cgroup (v2 or v1) memory limit leaves. `None` where
/// neither can be read (not Linux): callers then rely on fallible
/// allocation alone.
pub fn available_memory() -> Option<u64> {
    let meminfo = std::fs::read_to_string("/proc/meminfo").ok();
    let avail = meminfo.as_deref().and_then(mem_available);
    let cgroup = cgroup_left();
    match (avail, cgroup) {
        (Some(a), Some(c)) => Some(a.min(c)),
        (a, c) => a.or(c),
    }
}

/// `MemAvailable` of a /proc/meminfo text, bytes.
fn mem_available(meminfo: &str) -> Option<u64> {
    let line = meminfo.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

/// What the cgroup's memory limit leaves, where one is set.
fn cgroup_left() -> Option<u64> {
    let read = |p: &str| std::fs::read_to_string(p).ok();
    let num = |s: Option<String>| s.and_then(|s| s.trim().parse::<u64>().ok());
    // v2: "max" when unlimited (parse fails: None).
    if let Some(limit) = num(read("/sys/fs/cgroup/memory.max")) {
        let used = num(read("/sys/fs/cgroup/memory.current")).unwrap_or(0);
        return Some(limit.saturating_sub(used));
    }
    // v1: an unlimited group reports a huge number.
    let limit = num(read("/sys/fs/cgroup/memory/memory.limit_in_bytes"))?;
    if limit >= 1 << 60 {
        return None;
    }
    let used = num(read("/sys/fs/cgroup/memory/memory.usage_in_bytes")).unwrap_or(0);
    Some(limit.saturating_sub(used))
}

/// A byte count for messages: "1.50 GiB", "12.0 MiB".
pub fn human_bytes(b: u64) -> String {
    const MIB: f64 = (1u64 << 20) as f64;
    const GIB: f64 = (1u64 << 30) as f64;
    let f = b as f64;
    if f >= GIB {
        format!("{:.2} GiB", f / GIB)
    } else {
        format!("{:.1} MiB", f / MIB)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mem_available_reads_kib() {
        let text = "MemTotal:       24000000 kB\nMemFree:  1 kB\nMemAvailable:   2048 kB\n";
        assert_eq!(mem_available(text), Some(2048 * 1024));
        assert_eq!(mem_available("MemTotal: 5 kB\n"), None);
    }

    #[test]
    fn this_machine_reports_some_memory() {
        if cfg!(target_os = "linux") {
            let m = available_memory().expect("Linux has /proc/meminfo");
            assert!(m > 0);
        }
    }

    #[test]
    fn human_bytes_picks_a_unit() {
        assert_eq!(human_bytes(3 << 29), "1.50 GiB");
        assert_eq!(human_bytes(12 << 20), "12.0 MiB");
    }
}
