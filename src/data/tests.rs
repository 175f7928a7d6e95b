//! Tests of the data sources (the built-in MNIST-10k, IDX folders, Fashion-MNIST, CIFAR-10, synthetic data), padding, standardisation and validation.

use super::*;
use std::collections::{hash_map::DefaultHasher, HashSet};
use std::hash::{Hash, Hasher};
use std::time::Instant;

fn repo_data() -> PathBuf {
    crate::test_root().join("data/mnist-10k")
}

/// A hash of every image of a split.
fn image_hashes(s: &Samples, len: usize) -> Vec<u64> {
    s.images
        .chunks_exact(len)
        .map(|img| {
            let mut h = DefaultHasher::new();
            for v in img {
                v.to_bits().hash(&mut h);
            }
            h.finish()
        })
        .collect()
}

fn class_counts(labels: &[u32], classes: usize) -> Vec<usize> {
    let mut c = vec![0; classes];
    for &l in labels {
        c[l as usize] += 1;
    }
    c
}

/// A spec that keeps pixels as `byte/255`, so tests can compare them with the files.
fn spec(source: Source) -> DataSpec {
    DataSpec {
        normalize: Some(false),
        ..DataSpec::of(source)
    }
}

#[test]
fn builtin_mnist_10k_loads_all_digits() {
    let d = spec(Source::Mnist10k).load(None, 0).unwrap();
    assert_eq!(d.name, "mnist-10k");
    assert_eq!((d.shape, d.classes), ([1, 28, 28], 10));
    assert_eq!((d.train.len(), d.test.len()), (8000, 2000));
    assert_eq!(d.train.images.len(), 8000 * 784);
    assert_eq!(d.test.images.len(), 2000 * 784);
    let all: Vec<u32> = d
        .train
        .labels
        .iter()
        .chain(&d.test.labels)
        .copied()
        .collect();
    let counts = class_counts(&all, 10);
    println!("mnist-10k per-class counts: {counts:?}");
    assert_eq!(
        counts,
        [1001, 1127, 991, 1032, 980, 863, 1014, 1070, 944, 978]
    );
    // Real digits: mostly background, some ink, every value a byte / 255.
    let ink = d.train.images.iter().filter(|&&v| v > 0.5).count() as f64 / (8000.0 * 784.0);
    assert!((0.05..0.25).contains(&ink), "ink fraction {ink}");
    assert!(d
        .train
        .images
        .iter()
        .all(|&v| (v * 255.0 - (v * 255.0).round()).abs() < 1e-3 && (0.0..=1.0).contains(&v)));
}

#[test]
fn split_is_stratified_disjoint_and_complete() {
    let d = spec(Source::Mnist10k).load(None, 42).unwrap();
    let train = image_hashes(&d.train, 784);
    let test = image_hashes(&d.test, 784);
    let train_set: HashSet<u64> = train.iter().copied().collect();
    let test_set: HashSet<u64> = test.iter().copied().collect();
    // All 10,000 digits are distinct, so the union has 10,000 members and no image is in both.
    assert_eq!((train_set.len(), test_set.len()), (8000, 2000));
    assert!(train_set.is_disjoint(&test_set));
    assert_eq!(train_set.union(&test_set).count(), 10_000);
    let test_counts = class_counts(&d.test.labels, 10);
    println!("mnist-10k test counts (seed 42): {test_counts:?}");
    assert_eq!(
        test_counts,
        [200, 225, 198, 206, 196, 173, 203, 214, 189, 196]
    );
}

#[test]
fn split_depends_on_the_seed() {
    let a = spec(Source::Mnist10k).load(None, 7).unwrap();
    let b = spec(Source::Mnist10k).load(None, 7).unwrap();
    let c = spec(Source::Mnist10k).load(None, 8).unwrap();
    assert_eq!(a, b);
    assert_ne!(a.test, c.test);
    let a_test: HashSet<u64> = image_hashes(&a.test, 784).into_iter().collect();
    let c_test: HashSet<u64> = image_hashes(&c.test, 784).into_iter().collect();
    assert_ne!(
        a_test, c_test,
        "a different seed holds out different digits"
    );
}

#[test]
fn test_fraction_and_limits_apply() {
    let mut s = spec(Source::Mnist10k);
    s.test_fraction = Some(0.5);
    let half = s.load(None, 1).unwrap();
    assert_eq!((half.train.len(), half.test.len()), (5000, 5000));
    s.train_limit = Some(123);
    s.test_limit = Some(45);
    let limited = s.load(None, 1).unwrap();
    assert_eq!((limited.train.len(), limited.test.len()), (123, 45));
    assert_eq!(limited.train.images.len(), 123 * 784);
    assert_eq!(limited.train.labels[..], half.train.labels[..123]);
    assert_eq!(limited.test.images[..], half.test.images[..45 * 784]);
    // A limit above the size changes nothing.
    s.train_limit = Some(1_000_000);
    assert_eq!(s.load(None, 1).unwrap().train.len(), 5000);
}

#[test]
fn mnist_10k_from_a_folder_matches_the_builtin_copy() {
    let builtin = spec(Source::Mnist10k).load(None, 3).unwrap();
    let mut s = spec(Source::Mnist10k);
    s.path = Some(repo_data());
    assert_eq!(s.load(None, 3).unwrap(), builtin);
    // A relative path is taken from `base`.
    s.path = Some(PathBuf::from("data/mnist-10k"));
    let base = crate::test_root();
    assert_eq!(s.load(Some(&base), 3).unwrap(), builtin);
    // Uncompressed copies read the same.
    let dir = tempfile::tempdir().unwrap();
    for name in SINGLE {
        let gz = std::fs::read(repo_data().join(format!("{name}.gz"))).unwrap();
        let mut raw = Vec::new();
        std::io::Read::read_to_end(&mut flate2::read::GzDecoder::new(gz.as_slice()), &mut raw)
            .unwrap();
        std::fs::write(dir.path().join(name), raw).unwrap();
    }
    s.path = Some(dir.path().to_path_buf());
    assert_eq!(s.load(None, 3).unwrap(), builtin);
}

#[test]
fn mnist_10k_folder_without_files_says_what_is_expected() {
    let dir = tempfile::tempdir().unwrap();
    let mut s = spec(Source::Mnist10k);
    s.path = Some(dir.path().to_path_buf());
    let e = s.load(None, 0).unwrap_err();
    assert!(matches!(e, DataError::Missing { .. }), "{e:?}");
    let m = e.to_string();
    assert!(
        m.contains("images-idx3-ubyte") && m.contains("built into"),
        "{m}"
    );
}

/// Writes a small IDX dataset of `n` 3×2 images whose pixels encode their index and label.
fn write_set(dir: &Path, prefix: &str, n: usize, gz: bool) {
    let labels: Vec<u8> = (0..n).map(|i| (i % 3) as u8).collect();
    let pixels: Vec<u8> = (0..n * 6).map(|i| (i / 6 * 10 + i % 6) as u8).collect();
    let files = [
        (
            format!("{prefix}images-idx3-ubyte"),
            idx::encode(&[n as u32, 3, 2], &pixels),
        ),
        (
            format!("{prefix}labels-idx1-ubyte"),
            idx::encode(&[n as u32], &labels),
        ),
    ];
    for (name, bytes) in files {
        if gz {
            let name = format!("{name}.gz");
            std::fs::write(dir.join(name), idx::gzip(&bytes).unwrap()).unwrap();
        } else {
            std::fs::write(dir.join(name), bytes).unwrap();
        }
    }
}

#[test]
fn idx_folder_with_train_and_test_files_keeps_their_split() {
    let dir = tempfile::tempdir().unwrap();
    write_set(dir.path(), "train-", 12, true);
    write_set(dir.path(), "t10k-", 5, false);
    let mut s = spec(Source::Idx);
    s.path = Some(dir.path().to_path_buf());
    let d = s.load(None, 0).unwrap();
    assert_eq!((d.shape, d.classes), ([1, 3, 2], 3));
    assert_eq!((d.train.len(), d.test.len()), (12, 5));
    // File order is kept for official splits.
    assert_eq!(d.train.labels[..4], [0, 1, 2, 0]);
    assert_eq!(d.test.images[6], 10.0 / 255.0);
    // One of the four files missing names it.
    std::fs::remove_file(dir.path().join("t10k-labels-idx1-ubyte")).unwrap();
    let e = s.load(None, 0).unwrap_err();
    assert!(
        matches!(&e, DataError::Missing { path, .. } if path.ends_with("t10k-labels-idx1-ubyte")),
        "{e:?}"
    );
}

#[test]
fn idx_folder_with_one_set_is_split_by_fraction() {
    let dir = tempfile::tempdir().unwrap();
    write_set(dir.path(), "", 20, false);
    let mut s = spec(Source::Idx);
    s.path = Some(dir.path().to_path_buf());
    s.test_fraction = Some(0.25);
    let d = s.load(None, 5).unwrap();
    assert_eq!(d.classes, 3);
    assert_eq!((d.train.len(), d.test.len()), (15, 5));
    // 7, 7, 6 samples per class → 1.75, 1.75, 1.5 → 2, 2, 1 held out.
    assert_eq!(class_counts(&d.test.labels, 3), [2, 2, 1]);
    // Each image still carries its own label: pixel 0 is 10 × index, label is index mod 3.
    for (img, &l) in d.train.images.chunks_exact(6).zip(&d.train.labels) {
        let index = (img[0] * 255.0).round() as u32 / 10;
        assert_eq!(index % 3, l);
    }
}

#[test]
fn idx_errors_name_the_problem() {
    let dir = tempfile::tempdir().unwrap();
    let mut s = spec(Source::Idx);
    s.path = Some(dir.path().to_path_buf());
    let m = s.load(None, 0).unwrap_err().to_string();
    assert!(
        m.contains("no IDX files") && m.contains("t10k-images-idx3-ubyte"),
        "{m}"
    );
    s.path = Some(dir.path().join("absent"));
    let m = s.load(None, 0).unwrap_err().to_string();
    assert!(m.contains("no such folder"), "{m}");
    // Corrupt data: truncated images.
    s.path = Some(dir.path().to_path_buf());
    write_set(dir.path(), "", 4, false);
    let img = dir.path().join("images-idx3-ubyte");
    let mut bytes = std::fs::read(&img).unwrap();
    bytes.truncate(bytes.len() - 1);
    std::fs::write(&img, bytes).unwrap();
    let e = s.load(None, 0).unwrap_err();
    assert!(
        matches!(&e, DataError::Format { path, .. } if path == &img),
        "{e:?}"
    );
    // Missing `path` is caught before any file is read.
    let e = spec(Source::Idx).load(None, 0).unwrap_err();
    assert!(
        matches!(&e, DataError::Invalid(m) if m.contains("`path`")),
        "{e:?}"
    );
}

#[test]
fn too_few_samples_to_split_is_an_error() {
    let dir = tempfile::tempdir().unwrap();
    write_set(dir.path(), "", 2, false);
    let mut s = spec(Source::Idx);
    s.path = Some(dir.path().to_path_buf());
    // Two samples: 0.2 of them rounds to none held out.
    let e = s.load(None, 0).unwrap_err();
    assert!(
        matches!(&e, DataError::Invalid(m) if m.contains("test set empty")),
        "{e:?}"
    );
}

#[test]
fn fashion_mnist_when_installed() {
    let dir = Path::new(FASHION_MNIST_DIR);
    if !dir.is_dir() {
        println!("skipped: {FASHION_MNIST_DIR} not found (apt-get install dataset-fashion-mnist)");
        return;
    }
    let start = Instant::now();
    let d = spec(Source::FashionMnist).load(None, 0).unwrap();
    let elapsed = start.elapsed();
    println!("fashion-mnist loaded in {:.3} s", elapsed.as_secs_f64());
    assert_eq!(
        (d.name.as_str(), d.shape, d.classes),
        ("fashion-mnist", [1, 28, 28], 10)
    );
    assert_eq!((d.train.len(), d.test.len()), (60_000, 10_000));
    // Fashion-MNIST is exactly balanced: 6,000 and 1,000 per class.
    assert_eq!(class_counts(&d.train.labels, 10), vec![6000; 10]);
    assert_eq!(class_counts(&d.test.labels, 10), vec![1000; 10]);
}

#[test]
fn fashion_mnist_missing_says_how_to_get_it() {
    let mut s = spec(Source::FashionMnist);
    s.path = Some(PathBuf::from("/nonexistent/fashion"));
    let e = s.load(None, 0).unwrap_err();
    assert!(matches!(e, DataError::Missing { .. }), "{e:?}");
    let m = e.to_string();
    assert!(
        m.contains("apt-get install dataset-fashion-mnist") && m.contains("`path`"),
        "{m}"
    );
}

#[test]
fn synthetic_defaults_and_determinism() {
    let d = spec(Source::Synthetic).load(None, 9).unwrap();
    assert_eq!(
        (d.name.as_str(), d.shape, d.classes),
        ("synthetic", [1, 28, 28], 10)
    );
    assert_eq!((d.train.len(), d.test.len()), (8000, 2000));
    assert_eq!(d, spec(Source::Synthetic).load(None, 9).unwrap());
    assert_ne!(
        d.train,
        spec(Source::Synthetic).load(None, 10).unwrap().train
    );
    let mut s = spec(Source::Synthetic);
    s.shape = Some([3, 8, 4]);
    s.classes = Some(5);
    s.train_samples = Some(50);
    s.test_samples = Some(20);
    s.test_limit = Some(7);
    let d = s.load(None, 1).unwrap();
    assert_eq!((d.shape, d.classes, d.sample_len()), ([3, 8, 4], 5, 96));
    assert_eq!((d.train.len(), d.test.len()), (50, 7));
    assert_eq!(d.train.images.len(), 50 * 96);
    assert!(d.train.labels.iter().all(|&l| l < 5));
}

type Setter = fn(&mut DataSpec);

fn invalid(s: &DataSpec) -> (String, String) {
    match s.validate() {
        Err(e) => e,
        Ok(()) => panic!("{s:?} should be invalid"),
    }
}

#[test]
fn validate_accepts_defaults() {
    for source in [Source::Mnist10k, Source::FashionMnist, Source::Synthetic] {
        assert_eq!(spec(source).validate(), Ok(()));
    }
    let mut s = spec(Source::Idx);
    s.path = Some("x".into());
    s.test_fraction = Some(0.1);
    s.train_limit = Some(1);
    assert_eq!(s.validate(), Ok(()));
    let mut s = spec(Source::Synthetic);
    s.shape = Some([1, 1 << 14, 1 << 14]);
    s.classes = Some(100_000);
    // The largest samples, as many as synthetic data may hold (2^32 values).
    s.train_samples = Some(12);
    s.test_samples = Some(4);
    assert_eq!(s.validate(), Ok(()));
    // The default 10,000 of them would be 2^41 values.
    s.train_samples = None;
    s.test_samples = None;
    assert_eq!(invalid(&s).0, "train_samples");
}

#[test]
fn validate_rejects_bad_values() {
    for f in [0.0, 1.0, -0.1, 1.5, f64::NAN] {
        let mut s = spec(Source::Mnist10k);
        s.test_fraction = Some(f);
        let (k, m) = invalid(&s);
        assert_eq!(k, "test_fraction");
        assert!(m.contains("between 0 and 1"), "{m}");
    }
    let mut s = spec(Source::Mnist10k);
    s.train_limit = Some(0);
    assert_eq!(invalid(&s).0, "train_limit");
    let mut s = spec(Source::Synthetic);
    s.test_limit = Some(0);
    assert_eq!(invalid(&s).0, "test_limit");

    assert_eq!(invalid(&spec(Source::Idx)).0, "path");
    let mut s = spec(Source::Synthetic);
    s.path = Some("x".into());
    assert_eq!(invalid(&s).0, "path");
    for source in [Source::Synthetic, Source::FashionMnist] {
        let mut s = spec(source);
        s.test_fraction = Some(0.2);
        let (k, m) = invalid(&s);
        assert_eq!(k, "test_fraction");
        assert!(m.contains("own test set"), "{m}");
    }

    for source in [Source::Mnist10k, Source::FashionMnist] {
        let cases: [(&str, Setter); 4] = [
            ("shape", |s| s.shape = Some([1, 2, 2])),
            ("classes", |s| s.classes = Some(3)),
            ("train_samples", |s| s.train_samples = Some(3)),
            ("test_samples", |s| s.test_samples = Some(3)),
        ];
        for (key, set) in cases {
            let mut s = spec(source);
            set(&mut s);
            let (k, m) = invalid(&s);
            assert_eq!(k, key);
            assert!(m.contains("only applies to source synthetic"), "{m}");
        }
    }

    let synth = |f: fn(&mut DataSpec)| {
        let mut s = spec(Source::Synthetic);
        f(&mut s);
        invalid(&s)
    };
    assert_eq!(synth(|s| s.shape = Some([1, 0, 28])).0, "shape");
    let (k, m) = synth(|s| s.shape = Some([2, 1 << 14, 1 << 14]));
    assert!(k == "shape" && m.contains("2^28"), "{k} {m}");
    assert_eq!(synth(|s| s.shape = Some([usize::MAX, 2, 2])).0, "shape");
    assert_eq!(synth(|s| s.classes = Some(1)).0, "classes");
    assert_eq!(synth(|s| s.classes = Some(100_001)).0, "classes");
    assert_eq!(synth(|s| s.train_samples = Some(0)).0, "train_samples");
    assert_eq!(synth(|s| s.test_samples = Some(0)).0, "test_samples");
}

#[test]
fn load_checks_the_spec_first() {
    let mut s = spec(Source::Synthetic);
    s.classes = Some(1);
    let e = s.load(None, 0).unwrap_err();
    assert!(
        matches!(&e, DataError::Invalid(m) if m.starts_with("`classes`")),
        "{e:?}"
    );
}

#[test]
fn sources_parse_by_their_job_file_names() {
    for s in [
        Source::Mnist10k,
        Source::FashionMnist,
        Source::Idx,
        Source::Cifar10,
        Source::Synthetic,
    ] {
        let parsed: Source = serde_yaml::from_str(s.name()).unwrap();
        assert_eq!(parsed, s);
    }
}

#[test]
fn normalize_standardises_with_the_training_moments() {
    let raw = spec(Source::Mnist10k).load(None, 1).unwrap();
    let norm = DataSpec::of(Source::Mnist10k).load(None, 1).unwrap();
    let (mean, std) = norm.train_moments();
    assert!(mean.abs() < 1e-4, "mean {mean}");
    assert!((std - 1.0).abs() < 1e-4, "std {std}");
    let (m0, s0) = raw.train_moments();
    assert!(
        (0.05..0.25).contains(&m0) && (0.2..0.45).contains(&s0),
        "MNIST moments {m0} {s0}"
    );
    // The test split uses the training moments, not its own.
    let x = raw.test.images[300] as f64;
    assert!(((x - m0) / s0 - norm.test.images[300] as f64).abs() < 1e-5);
}

/// Writes six CIFAR-10 batches into `dir`: two records in each training batch and three in the
/// test batch. Record `k` has label `k % 10`; its red plane is `10·k`, green `10·k + 1`, and blue
/// `10·k + 2` plus the column.
fn write_cifar(dir: &Path) {
    testing::write_cifar(dir, 2, (20, 3), |k, c, _, x| {
        (10 * k + c + x * (c / 2)) as u8
    });
}

#[test]
fn cifar10_loads_from_a_relative_path_and_standardises_each_plane() {
    let base = tempfile::tempdir().unwrap();
    let dir = base.path().join("cifar").join(cifar::EXTRACTED);
    std::fs::create_dir_all(&dir).unwrap();
    write_cifar(&dir);
    let mut s = spec(Source::Cifar10);
    s.path = Some(PathBuf::from("cifar"));
    let raw = s.load(Some(base.path()), 0).unwrap();
    assert_eq!(
        (raw.name.as_str(), raw.shape, raw.classes),
        ("cifar10", [3, 32, 32], 10)
    );
    assert_eq!((raw.train.len(), raw.test.len()), (10, 3));
    assert_eq!(raw.train.labels, (0..10).collect::<Vec<u32>>());
    // Sample 4, green plane, any pixel: 10·4 + 1.
    assert_eq!(raw.train.images[4 * 3072 + 1024 + 33], 41.0 / 255.0);
    // Blue plane, row 3, column 31: 10·4 + 2 + 31.
    assert_eq!(
        raw.train.images[4 * 3072 + 2048 + 3 * 32 + 31],
        73.0 / 255.0
    );

    s.normalize = None;
    s.train_limit = Some(6);
    let norm = s.load(Some(base.path()), 0).unwrap();
    assert_eq!((norm.train.len(), norm.test.len()), (6, 3));
    for (c, (mean, std)) in norm.channel_moments().into_iter().enumerate() {
        assert!(
            mean.abs() < 1e-5 && (std - 1.0).abs() < 1e-4,
            "channel {c}: {mean} {std}"
        );
    }
    // The red plane of the six training samples is 0, 10, ..., 50 (/255): mean 25, std √291.67.
    let expected = (200.0 - 25.0) / (291.666_666_7f64).sqrt();
    assert!(
        (norm.test.images[0] as f64 - expected).abs() < 1e-4,
        "{}",
        norm.test.images[0]
    );
}

#[test]
fn cifar10_errors_reach_the_spec() {
    let dir = tempfile::tempdir().unwrap();
    let mut s = spec(Source::Cifar10);
    s.path = Some(dir.path().to_path_buf());
    let e = s.load(None, 0).unwrap_err();
    assert!(matches!(e, DataError::Missing { .. }), "{e:?}");
    assert!(e.to_string().contains("data_batch_1.bin"), "{e}");
    write_cifar(dir.path());
    std::fs::write(dir.path().join("data_batch_2.bin"), [1u8; 3074]).unwrap();
    let m = s.load(None, 0).unwrap_err().to_string();
    assert!(
        m.contains("data_batch_2.bin") && m.contains("3074 bytes"),
        "{m}"
    );
    let e = spec(Source::Cifar10).load(None, 0).unwrap_err();
    assert!(
        matches!(&e, DataError::Invalid(m) if m.contains("`path`")),
        "{e:?}"
    );
}

#[test]
fn per_channel_moments_match_the_global_ones_for_one_channel() {
    let d = spec(Source::Mnist10k).load(None, 2).unwrap();
    assert_eq!(d.channel_moments(), vec![d.train_moments()]);
    let mut s = spec(Source::Synthetic);
    s.shape = Some([3, 6, 5]);
    s.train_samples = Some(40);
    s.test_samples = Some(10);
    let raw = s.load(None, 2).unwrap();
    let moments = raw.channel_moments();
    assert_eq!(moments.len(), 3);
    // The channels differ, so one global mean would leave them off centre.
    assert!(
        moments.windows(2).any(|m| (m[0].0 - m[1].0).abs() > 1e-3),
        "{moments:?}"
    );
    s.normalize = None;
    let norm = s.load(None, 2).unwrap();
    for (c, (mean, std)) in norm.channel_moments().into_iter().enumerate() {
        assert!(
            mean.abs() < 1e-5 && (std - 1.0).abs() < 1e-4,
            "channel {c}: {mean} {std}"
        );
    }
    // Test pixel: sample 1, channel 2, element 7, standardised with the training moments.
    let i = 90 + 2 * 30 + 7;
    let (m2, s2) = moments[2];
    assert!(((raw.test.images[i] as f64 - m2) / s2 - norm.test.images[i] as f64).abs() < 1e-5);
}

#[test]
fn pad_to_centres_each_image_in_a_zero_border() {
    // 3×2 images padded to 6×5: one row above and two below, one column left and two right.
    let mut s = spec(Source::Synthetic);
    s.shape = Some([2, 3, 2]);
    s.train_samples = Some(4);
    s.test_samples = Some(3);
    let raw = s.load(None, 1).unwrap();
    s.pad_to = Some([6, 5]);
    let padded = s.load(None, 1).unwrap();
    assert_eq!((padded.shape, padded.sample_len()), ([2, 6, 5], 60));
    assert_eq!((padded.train.len(), padded.test.len()), (4, 3));
    assert_eq!(padded.train.labels, raw.train.labels);
    assert_eq!(padded.test.images.len(), 3 * 60);
    for (split_raw, split_pad) in [(&raw.train, &padded.train), (&raw.test, &padded.test)] {
        for (src, dst) in split_raw
            .images
            .chunks_exact(6)
            .zip(split_pad.images.chunks_exact(30))
        {
            for y in 0..6 {
                for x in 0..5 {
                    let inside = (1..4).contains(&y) && (1..3).contains(&x);
                    let want = if inside {
                        src[(y - 1) * 2 + (x - 1)]
                    } else {
                        0.0
                    };
                    assert_eq!(dst[y * 5 + x], want, "row {y} column {x}");
                }
            }
        }
    }
    // The same size changes nothing.
    s.pad_to = Some([3, 2]);
    assert_eq!(s.load(None, 1).unwrap(), raw);
}

#[test]
fn pad_to_borders_are_standardised_zeros_and_images_keep_their_values() {
    let mut s = DataSpec::of(Source::Mnist10k);
    s.train_limit = Some(500);
    s.test_limit = Some(100);
    let plain = s.load(None, 4).unwrap();
    let (mean, std) = spec(Source::Mnist10k)
        .load(None, 4)
        .map(|mut d| {
            d.train.labels.truncate(500);
            d.train.images.truncate(500 * 784);
            d.train_moments()
        })
        .unwrap();
    s.pad_to = Some([32, 32]);
    let padded = s.load(None, 4).unwrap();
    assert_eq!(padded.shape, [1, 32, 32]);
    assert_eq!(padded.train.images.len(), 500 * 1024);
    let zero = ((0.0 - mean) / std) as f32;
    assert!(zero < -0.3, "a 0 pixel standardises below the mean: {zero}");
    for (src, dst) in plain
        .test
        .images
        .chunks_exact(784)
        .zip(padded.test.images.chunks_exact(1024))
    {
        for y in 0..32 {
            for x in 0..32 {
                let v = dst[y * 32 + x];
                if (2..30).contains(&y) && (2..30).contains(&x) {
                    assert_eq!(v, src[(y - 2) * 28 + (x - 2)]);
                } else {
                    assert!(
                        (v - zero).abs() < 1e-6,
                        "border ({y}, {x}) is {v}, want {zero}"
                    );
                }
            }
        }
    }
}

#[test]
fn pad_to_smaller_than_the_image_is_an_error() {
    let mut s = spec(Source::Mnist10k);
    s.pad_to = Some([32, 27]);
    let e = s.load(None, 0).unwrap_err();
    assert!(
        matches!(&e, DataError::Invalid(m) if m.contains("`pad_to` [32, 27]") && m.contains("28×28")),
        "{e:?}"
    );
    let mut s = spec(Source::Synthetic);
    s.shape = Some([1, 1 << 14, 1 << 14]);
    s.train_samples = Some(1);
    s.test_samples = Some(1);
    s.pad_to = Some([1 << 14, 1 << 14]);
    assert_eq!(s.validate(), Ok(()));
    let mut d = Dataset::zeros("tiny", [2, 1, 1], 2, 0, 0);
    let e = d.pad([1 << 14, 1 << 14]).unwrap_err();
    assert!(e.to_string().contains("2^28"), "{e}");
}

#[test]
fn validate_checks_cifar10_and_pad_to() {
    let mut s = spec(Source::Cifar10);
    assert_eq!(invalid(&s).0, "path");
    s.path = Some("cifar".into());
    s.pad_to = Some([40, 40]);
    s.train_limit = Some(100);
    assert_eq!(s.validate(), Ok(()));
    s.test_fraction = Some(0.2);
    let (k, m) = invalid(&s);
    assert!(
        k == "test_fraction" && m.contains("own test set"),
        "{k} {m}"
    );
    s.test_fraction = None;
    s.classes = Some(10);
    assert_eq!(invalid(&s).0, "classes");
    s.classes = None;
    for bad in [[0, 32], [32, 0], [1 << 15, 1 << 14], [usize::MAX, 2]] {
        s.pad_to = Some(bad);
        assert_eq!(invalid(&s).0, "pad_to", "{bad:?}");
    }
}
