//! kernels/moe.cu's `moe_tiles_i32`: a step's slots grouped by expert on
//! the device, against the CPU's grouping.

use super::super::*;

/// `moe_tiles`'s grouping on the CPU: the slots sorted by expert (ids
/// clamped into 0 .. E - 1), stable; the tiles (first position, slots) of
/// each expert of two or more slots (ceil(c / cap) as equal as can be, the
/// longer first), in expert order, then the experts of one.
fn tiles_reference(ids: &[i32], e: usize, cap: i32) -> (Vec<i32>, Vec<(i32, i32)>) {
    let of = |id: i32| id.clamp(0, e as i32 - 1);
    let mut order: Vec<i32> = (0..ids.len() as i32).collect();
    order.sort_by_key(|&j| of(ids[j as usize]));
    let (mut multi, mut single, mut at) = (Vec::new(), Vec::new(), 0i32);
    for x in 0..e as i32 {
        let c = ids.iter().filter(|&&id| of(id) == x).count() as i32;
        if c == 1 {
            single.push((at, 1));
        } else if c >= 2 {
            let n = (c + cap - 1) / cap;
            let mut p = at;
            for t in 0..n {
                let m = c / n + i32::from(t < c % n);
                multi.push((p, m));
                p += m;
            }
        }
        at += c;
    }
    multi.extend(single);
    (order, multi)
}

/// The slots grouped by expert on the device (`moe_tiles`) against
/// [`tiles_reference`]: every entry of order and of the tiles it wrote
/// (poisoned before; nothing past the count's tiles within the bound
/// written), for uniform and lopsided routings of 1 to 4096 slots over 1
/// to 1024 experts, ids outside the experts clamped, in tiles of at most
/// 8 (the grouped GEMVs), 32 and 64 (the grouped GEMMs); what it refuses.
#[test]
#[ignore = "needs a GPU"]
fn moe_tiles_group_slots_by_expert() {
    let (_dev, s, k, mut rng) = setup("moe_tiles_group_slots_by_expert");
    for shape in [
        (1, 1, false),
        (8, 8, false),
        (32, 128, false),
        (64, 128, true),
        (256, 128, false),
        (100, 3, true),
        (4096, 128, false),
        (4096, 8, true),
        (700, 1024, false),
        (17, 1000, true),
    ]
    .into_iter()
    .flat_map(|c| [8, 32, 64].map(|cap| (c, cap)))
    {
        let ((slots, e, lopsided), cap) = shape;
        let mut ids: Vec<i32> = (0..slots)
            .map(|_| match lopsided && rng.below(2) == 0 {
                true => rng.below(2.min(e)) as i32,
                false => rng.below(e) as i32,
            })
            .collect();
        if slots > 3 {
            ids[3] = -5;
            ids[slots - 1] = e as i32 + 7;
        }
        let bound = m40_kernels::moe_tile_bound(slots, e, cap);
        let idg = s.upload(&ids, "ids").unwrap();
        let mut order = s.alloc::<i32>(slots, "order").unwrap();
        let mut tiles = s.alloc::<i32>(1 + 2 * bound, "tiles").unwrap();
        s.fill_bytes(&mut order, 0xFF).unwrap();
        s.fill_bytes(&mut tiles, 0xFF).unwrap();
        let mut seen = s.alloc_zeroed::<u64>(3, "seen").unwrap();
        k.moe_tiles(
            &s,
            &idg.view(),
            e,
            cap,
            &mut order,
            &mut tiles,
            Some((&mut seen, 1)),
        )
        .unwrap();
        // The experts with a slot, added to entry 1 only.
        let chosen: std::collections::BTreeSet<i32> =
            ids.iter().map(|&id| id.clamp(0, e as i32 - 1)).collect();
        let (got_o, got_t) = (s.download(&order).unwrap(), s.download(&tiles).unwrap());
        let (want_o, want_t) = tiles_reference(&ids, e, cap as i32);
        let what = format!("moe_tiles {slots} slots, {e} experts, lopsided {lopsided}, cap {cap}");
        assert_eq!(got_o, want_o, "{what}: order");
        assert_eq!(
            s.download(&seen).unwrap(),
            [0, chosen.len() as u64, 0],
            "{what}: seen"
        );
        assert_eq!(got_t[0] as usize, want_t.len(), "{what}: tiles");
        assert!(want_t.len() <= bound, "{what}: the bound");
        let pairs: Vec<(i32, i32)> = (0..want_t.len())
            .map(|i| (got_t[1 + 2 * i], got_t[2 + 2 * i]))
            .collect();
        assert_eq!(pairs, want_t, "{what}: tiles");
        assert!(
            got_t[1 + 2 * want_t.len()..].iter().all(|&v| v == -1),
            "{what}: wrote past its tiles"
        );
    }
    let idg = s.upload(&[0i32; 4], "ids").unwrap();
    let mut order = s.alloc::<i32>(4, "order").unwrap();
    let mut tiles = s
        .alloc::<i32>(1 + 2 * m40_kernels::moe_tile_bound(4, 8, 8), "tiles")
        .unwrap();
    assert!(k
        .moe_tiles(&s, &idg.view(), 0, 8, &mut order, &mut tiles, None)
        .is_err());
    assert!(k
        .moe_tiles(&s, &idg.view(), 1025, 8, &mut order, &mut tiles, None)
        .is_err());
    let mut short = s.alloc::<i32>(2, "tiles").unwrap();
    assert!(k
        .moe_tiles(&s, &idg.view(), 8, 8, &mut order, &mut short, None)
        .is_err());
    assert!(k
        .moe_tiles(&s, &idg.view(), 8, 0, &mut order, &mut tiles, None)
        .is_err());
}
