//! The device layer on a real GPU: properties, the memory budget, copies of
//! every kind, events and streams. The GPU tests are ignored without
//! `--include-ignored` and fail with it where there is no GPU.

use m40_device::testing::{gpu_device, gpu_required};
use m40_device::{Device, DeviceError, DeviceOptions};

fn fresh(n: usize, salt: u32) -> Vec<u32> {
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(7);
    (0..n as u32)
        .map(|i| (i ^ salt ^ t).wrapping_mul(2_654_435_761))
        .collect()
}

#[test]
fn without_a_gpu_open_is_an_error_with_a_hint() {
    match Device::open(0) {
        Ok(d) => eprintln!("GPU present: {:?}", d.info()),
        Err(e) => {
            assert!(!gpu_required(), "M40_REQUIRE_GPU=1 but: {e}");
            let msg = e.to_string();
            assert!(
                matches!(e, DeviceError::NoDriver | DeviceError::NoDevice(_)),
                "{msg}"
            );
            assert!(msg.contains("driver") || msg.contains("GPU"), "{msg}");
        }
    }
}

#[test]
#[ignore = "needs a GPU"]
fn device_properties() {
    let d = gpu_device("device_properties");
    let i = d.info();
    eprintln!("{i:?}");
    assert!(i.compute_capability >= (5, 2));
    assert!(i.sm_count > 0 && i.total_memory > 0 && i.max_shared_per_block >= 48 * 1024);
    assert!(i.driver_version >= m40_device::MIN_DRIVER_VERSION);
    let (free, total) = d.memory().unwrap();
    assert!(free <= total && total == i.total_memory);
    assert!(d.budget_limit() <= free);
    assert!(matches!(
        Device::open(1 << 20),
        Err(DeviceError::BadOrdinal { .. })
    ));
}

#[test]
#[ignore = "needs a GPU"]
fn budget_refuses_and_names_the_allocation() {
    let d = gpu_device("budget_refuses_and_names_the_allocation");
    // A budget of ~0.1% of free memory: a few MB.
    let small = Device::open_with(
        d.info().ordinal,
        DeviceOptions {
            memory_share: 0.001,
            ..Default::default()
        },
    )
    .unwrap();
    let s = small.stream();
    let limit = small.budget_limit();
    let a = s.alloc::<u8>(limit / 2, "half the budget").unwrap();
    assert!(small.budget_used() >= limit / 2);
    match s.alloc::<f32>(limit / 4, "the KV cache") {
        Err(DeviceError::OutOfMemory {
            what, requested, ..
        }) => {
            assert_eq!(what, "the KV cache");
            assert_eq!(requested, limit / 4 * 4);
        }
        other => panic!("expected OutOfMemory, got {other:?}"),
    }
    let msg = s
        .alloc::<f32>(limit, "weights of blk.0")
        .unwrap_err()
        .to_string();
    assert!(
        msg.contains("weights of blk.0") && msg.contains("free"),
        "{msg}"
    );
    drop(a);
    assert_eq!(small.budget_used(), 0);
    // What was freed can be allocated again.
    s.alloc::<f32>(limit / 8, "again").unwrap();
}

#[test]
#[ignore = "needs a GPU"]
fn copies_round_trip() {
    let d = gpu_device("copies_round_trip");
    let s = d.stream();
    for n in [1usize, 1000, 1 << 20] {
        let v = fresh(n, n as u32);
        // Pageable host <-> device.
        let a = s.upload(&v, "a").unwrap();
        assert_eq!(s.download(&a).unwrap(), v);
        // Device -> device.
        let mut b = s.alloc::<u32>(n, "b").unwrap();
        s.fill_bytes(&mut b, 0xFF).unwrap();
        s.copy_device(&a.view(), &mut b).unwrap();
        assert_eq!(s.download(&b).unwrap(), v);
        // Pinned, asynchronous both ways, then a slice of the middle.
        let mut p = s.alloc_pinned::<u32>(n, "staging").unwrap();
        p.as_mut_slice().unwrap().copy_from_slice(&v);
        let mut c = s.alloc::<u32>(n, "c").unwrap();
        s.copy_from_pinned(&p, &mut c).unwrap();
        let mut back = s.alloc_pinned::<u32>(n, "back").unwrap();
        s.copy_to_pinned(&c.view(), &mut back).unwrap();
        assert_eq!(back.as_slice().unwrap(), &v[..]);
        let mid = c.slice(n / 3..n / 2 + 1).unwrap();
        let mut part = vec![0u32; mid.len()];
        s.copy_to_host(&mid, &mut part).unwrap();
        assert_eq!(part, v[n / 3..n / 2 + 1]);
    }
    // Within one buffer, both directions; out of range is an error.
    let v = fresh(1000, 7);
    let mut w = s.upload(&v, "w").unwrap();
    s.copy_device_within(&mut w, 10..110, 500).unwrap();
    s.copy_device_within(&mut w, 900..1000, 0).unwrap();
    let mut want = v.clone();
    want.copy_within(10..110, 500);
    want.copy_within(900..1000, 0);
    assert_eq!(s.download(&w).unwrap(), want);
    assert!(matches!(
        s.copy_device_within(&mut w, 950..1001, 0),
        Err(DeviceError::Size { .. })
    ));
    // Device -> host length mismatches are errors, not truncation.
    let a = s.upload(&[1u32, 2, 3], "a").unwrap();
    let mut short = vec![0u32; 2];
    assert!(matches!(
        s.copy_to_host(&a.view(), &mut short),
        Err(DeviceError::Size { .. })
    ));
    assert!(a.slice(2..4).is_err());
    // Host -> device fills a prefix; a longer source is an error.
    let mut b = s.upload(&[9u32; 5], "b").unwrap();
    s.copy_to_device(&[1u32, 2], &mut b).unwrap();
    assert_eq!(s.download(&b).unwrap(), [1, 2, 9, 9, 9]);
    assert!(matches!(
        s.copy_to_device(&[0u32; 6], &mut b),
        Err(DeviceError::Size { .. })
    ));
}

#[test]
#[ignore = "needs a GPU"]
fn events_order_streams_and_time() {
    let d = gpu_device("events_order_streams_and_time");
    let s1 = d.stream();
    let s2 = d.new_stream().unwrap();
    let v = fresh(4 << 20, 3);
    let start = s1.record().unwrap();
    let a = s1.upload(&v, "a").unwrap();
    let done = s1.record().unwrap();
    s2.wait(&done).unwrap();
    let mut b = s2.alloc::<u32>(v.len(), "b").unwrap();
    s2.copy_device(&a.view(), &mut b).unwrap();
    assert_eq!(s2.download(&b).unwrap(), v);
    done.synchronize().unwrap();
    let ms = start.elapsed_ms(&done).unwrap();
    assert!(ms >= 0.0 && ms.is_finite(), "{ms}");
}

/// Two engines on one GPU (replicas, stages) open it twice and share its
/// context: one's captures must survive the other's synchronizes, and a
/// synchronize inside a capture is refused, not a hang.
#[test]
#[ignore = "needs a GPU"]
fn captures_survive_synchronizes_from_another_thread() {
    let d = gpu_device("captures_survive_synchronizes_from_another_thread");
    let other = Device::open(d.info().ordinal).unwrap();
    let stop = std::sync::atomic::AtomicBool::new(false);
    std::thread::scope(|sc| {
        let syncs = sc.spawn(|| {
            let s = other.stream();
            let v = fresh(1 << 16, 11);
            let mut n = 0;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let a = s.upload(&v, "a").unwrap();
                other.synchronize().unwrap();
                assert_eq!(s.download(&a).unwrap(), v);
                n += 1;
            }
            n
        });
        let s = d.new_stream().unwrap();
        for round in 0..200 {
            let v = fresh(1 << 16, round);
            let a = s.upload(&v, "a").unwrap();
            let mut b = s.alloc_zeroed::<u32>(v.len(), "b").unwrap();
            let g = s
                .capture(|s| s.copy_device(&a.view(), &mut b))
                .unwrap_or_else(|e| panic!("capture {round}: {e}"));
            // SAFETY: `a` and `b` outlive the replay (synchronized below).
            unsafe { g.launch() }.unwrap();
            s.synchronize().unwrap();
            assert_eq!(s.download(&b).unwrap(), v, "round {round}");
        }
        let inside = s.capture(|_| d.synchronize());
        assert!(
            matches!(inside, Err(DeviceError::Capture(_))),
            "{:?}",
            inside.err()
        );
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        let n = syncs.join().unwrap();
        eprintln!("200 captures beside {n} synchronizes");
    });
}
