//! Slices on one GPU: a memory cap that holds, green partitions on disjoint SMs, and trials sharing one.

use super::*;

pub(crate) fn a_trial_over_its_cap_fails_and_one_at_its_cap_fits() {
    let e = gpu_or_skip!();
    let dev = e.upload(&tiny_data()).expect("upload");
    let elems = 3 << 20; // 12 MiB of arena
    let mut free = e.backend(Arc::clone(&dev), None, None).expect("backend");
    free.alloc_arena(elems).expect("uncapped arena");
    let need = free.allocated_bytes() as u64;
    // The cuBLAS workspace is part of the one allocation: 32 MiB from Hopper on, else 4 MiB.
    let blas: u64 = if e.info().compute_capability.0 >= 9 {
        32 << 20
    } else {
        4 << 20
    };
    assert!(need >= (elems * 4) as u64 + blas, "{need} bytes");
    drop(free);
    let mut over = e
        .backend(Arc::clone(&dev), Some(need - 1), None)
        .expect("backend");
    match over.alloc_arena(elems) {
        Err(EngineError::CapExceeded { need_mib, cap_mib }) => {
            assert!(need_mib > cap_mib, "{need_mib} vs {cap_mib}");
        }
        other => panic!("expected CapExceeded, got {other:?}"),
    }
    assert_eq!(over.allocated_bytes(), 0);
    let mut tight = e
        .backend(Arc::clone(&dev), Some(need), None)
        .expect("backend");
    tight
        .alloc_arena(elems)
        .expect("an arena exactly at the cap fits");
    // Replacing the arena frees the old one first, so it fits again.
    tight
        .alloc_arena(elems)
        .expect("a second arena replaces the first");
    let r = Region::new(elems - 10, 10);
    tight.fill(r, 1.5).expect("fill");
    let mut out = [0.0; 10];
    tight.read(r, &mut out).expect("read");
    assert_eq!(out, [1.5; 10]);
}

pub(crate) fn green_partitions_run_on_disjoint_sms() {
    let e = gpu_or_skip!();
    let Some(caps) = green_or_skip(&e) else {
        return;
    };
    let parts = e
        .green_partitions(2, caps.min_sms)
        .expect("two partitions of the minimum size");
    assert_eq!(parts.len(), 2);
    let mut sets = Vec::new();
    for part in &parts {
        assert!(part.sm_count >= caps.min_sms, "{} SMs", part.sm_count);
        let ids = e.sm_probe(Some(part), 64 * part.sm_count).expect("probe");
        let set: BTreeSet<u32> = ids.into_iter().collect();
        assert!(
            set.len() <= part.sm_count as usize,
            "partition {} ran on {} SMs, has {}",
            part.index,
            set.len(),
            part.sm_count
        );
        sets.push(set);
    }
    assert!(
        sets[0].is_disjoint(&sets[1]),
        "partitions share SMs: {:?} and {:?}",
        sets[0],
        sets[1]
    );
    let whole: BTreeSet<u32> = e
        .sm_probe(None, 64 * e.info().sm_count)
        .expect("probe")
        .into_iter()
        .collect();
    println!(
        "SMs used: partition 0 {}, partition 1 {}, primary context {}",
        sets[0].len(),
        sets[1].len(),
        whole.len()
    );
}

pub(crate) fn trials_sharing_a_green_partition_compute_correctly() {
    let e = gpu_or_skip!();
    let Some(caps) = green_or_skip(&e) else {
        return;
    };
    let parts = e.green_partitions(1, caps.min_sms).expect("partition");
    let data = tiny_data();
    let dev = e.upload(&data).expect("upload");
    std::thread::scope(|s| {
        for t in 0..2 {
            let (e, data, dev) = (&e, Arc::clone(&data), Arc::clone(&dev));
            let part = Arc::clone(&parts[0]);
            s.spawn(move || {
                let mut p = Pair::on(e, data, dev, Some(part));
                let g = GemmShape {
                    trans_b: true,
                    ..GemmShape::nn(64, 32, 48)
                };
                let (a, b) = (
                    p.random(g.a_len(), -1.0, 1.0),
                    p.random(g.b_len(), -1.0, 1.0),
                );
                let (c, r) = (p.region(g.c_len()), p.region(g.c_len()));
                let counter = p.region(COUNTER_LEN);
                p.set(counter, &[f32::from_bits(0)]);
                let gpu = p.gpu.as_mut();
                // As a trial does: the first step eagerly, with the process's captures held
                // off while its kernels load (cuBLAS's too, lazily, in this new green context).
                {
                    let _hold = gpu.hold_captures();
                    gpu.gemm(g, a, b, c).expect("eager gemm");
                    gpu.relu_fwd(c, r, g.c_len()).expect("eager relu");
                }
                gpu.begin_capture().expect("begin");
                gpu.gemm(g, a, b, c).expect("gemm");
                gpu.relu_fwd(c, r, g.c_len()).expect("relu");
                gpu.advance(counter).expect("advance");
                gpu.end_capture().expect("end");
                for _ in 0..50 {
                    gpu.replay().expect("replay");
                }
                p.cpu.gemm(g, a, b, c).expect("cpu gemm");
                p.cpu.relu_fwd(c, r, g.c_len()).expect("cpu relu");
                p.assert_close(r, 1e-4, 1e-4, &format!("thread {t}: gemm+relu"));
                let mut n = [0.0f32];
                p.gpu.read(counter, &mut n).expect("read");
                assert_eq!(n[0].to_bits(), 50, "thread {t}: replays");
            });
        }
    });
}
/// On a GPU with green contexts: partitions of unequal size run on disjoint SMs, each on at least
/// the SMs asked for.
pub(crate) fn unequal_green_partitions_are_disjoint() {
    let engine = gpu_or_skip!();
    let Some(caps) = green_or_skip(&engine) else {
        return;
    };
    // The groups the driver makes on this GPU (fewer than SMs / unit where processing clusters
    // leave SMs over): as large as fits, 5:3 like the job's ratios, in whole groups.
    let g = caps.unit();
    let total = engine.info().sm_count;
    let groups = caps.groups.unwrap_or(total / g).min(total / g);
    assert!(
        groups >= 2,
        "{groups} groups of {g} SMs: too few for two partitions"
    );
    let a_groups = (groups * 5 / 8).clamp(1, groups - 1);
    let b_groups = (groups * 3 / 8).clamp(1, groups - a_groups);
    let (a, b) = (a_groups * g, b_groups * g);
    let parts = engine.green_partitions_sized(&[a, b]).expect("partitions");
    assert_eq!(parts.len(), 2);
    assert!(
        parts[0].sm_count >= a && parts[1].sm_count >= b,
        "{} {}",
        parts[0].sm_count,
        parts[1].sm_count
    );
    let mut seen = Vec::new();
    for p in &parts {
        let sms: std::collections::BTreeSet<u32> = engine
            .sm_probe(Some(p), 4 * total)
            .expect("probe")
            .into_iter()
            .collect();
        assert!(
            sms.len() as u32 <= p.sm_count,
            "partition {} ran on {} SMs",
            p.index,
            sms.len()
        );
        seen.push(sms);
    }
    assert!(
        seen[0].is_disjoint(&seen[1]),
        "{:?} and {:?} overlap",
        seen[0],
        seen[1]
    );
    println!(
        "green partitions of {a} and {b} SMs: got {} and {}",
        parts[0].sm_count, parts[1].sm_count
    );
    // Partitions that do not fit together are an error, not a crash.
    assert!(engine.green_partitions_sized(&[total, g]).is_err());
}
