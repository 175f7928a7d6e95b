//! Each kernel's parameter types, read from its CUDA source (`kernels.rs`'s `parse`), so a launch whose arguments do not match them fails with an error instead of corrupting memory.

use std::collections::HashMap;
use std::sync::OnceLock;

use super::kernels::MODULES;
pub use super::kernels::{parse, ParamKind};

/// The parameters of kernel `name` of the built-in modules, when its source declares it and
/// every parameter's type is one a launch passes.
pub fn of(name: &str) -> Option<&'static [ParamKind]> {
    static ALL: OnceLock<HashMap<String, Vec<ParamKind>>> = OnceLock::new();
    ALL.get_or_init(|| {
        MODULES
            .iter()
            .filter_map(|m| parse(m.source).ok())
            .flatten()
            .map(|(name, kinds)| (name.to_string(), kinds))
            .collect()
    })
    .get(name)
    .map(Vec::as_slice)
}

/// Whether a launch of `name` with arguments of these kinds matches its declaration.
pub fn check(name: &str, given: &[ParamKind]) -> Result<(), String> {
    let words = |k: &[ParamKind]| k.iter().map(|k| k.name()).collect::<Vec<_>>().join(", ");
    match of(name) {
        None => Err(format!("kernel {name} has no known parameter list")),
        Some(want) if want != given => Err(format!(
            "kernel {name} takes ({}) but the launch passes ({})",
            words(want),
            words(given)
        )),
        Some(_) => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ParamKind::*;

    #[test]
    fn every_kernel_of_every_module_has_a_parameter_list() {
        for m in MODULES {
            let parsed = parse(m.source).unwrap_or_else(|e| panic!("{}.cu: {e}", m.name));
            let names: Vec<&str> = parsed.iter().map(|(n, _)| *n).collect();
            assert_eq!(names, m.functions(), "{}.cu", m.name);
            for f in m.functions() {
                assert!(of(f).is_some(), "{f}");
            }
        }
    }

    #[test]
    fn parameter_lists_are_read_as_launches_pass_them() {
        assert_eq!(
            of("dropout_fwd"),
            Some(&[Ptr, Ptr, U32, F32, U64, Ptr, U32, U64][..])
        );
        assert_eq!(
            of("softmax_xent"),
            Some(&[Ptr, Ptr, Ptr, Ptr, U32, U32][..])
        );
        assert_eq!(of("sm_probe"), Some(&[Ptr][..]));
        let src = "extern \"C\" __global__ void __launch_bounds__(64) k(const float* a, unsigned long long n, int m)\n{}\n__global__ void none() {}";
        assert_eq!(
            parse(src),
            Ok(vec![("k", vec![Ptr, U64, U32]), ("none", vec![])])
        );
        let e = parse("__global__ void k(double x) {}").unwrap_err();
        assert!(e.contains("kernel k") && e.contains("double x"), "{e}");
    }

    #[test]
    fn the_readme_gives_each_kernel_the_parameters_of_its_source() {
        let readme = include_str!("../../../kernels/README.md");
        let mut seen = 0;
        for line in readme.lines().filter(|l| l.starts_with('|')) {
            let Some(sig) = line
                .split('|')
                .nth(2)
                .and_then(|c| c.trim().strip_prefix('`'))
                .and_then(|c| c.strip_suffix('`'))
            else {
                continue;
            };
            let source = format!("__global__ void {sig} {{}}");
            let parsed = parse(&source).unwrap_or_default();
            let [(name, kinds)] = parsed.as_slice() else {
                panic!("kernels/README.md: cannot read `{sig}`");
            };
            assert_eq!(
                Some(kinds.as_slice()),
                of(name),
                "kernels/README.md: `{sig}`"
            );
            seen += 1;
        }
        assert_eq!(seen, 49);
    }

    #[test]
    fn a_launch_that_does_not_match_is_refused() {
        assert!(check("fill", &[Ptr, F32, U32]).is_ok());
        let e = check("fill", &[Ptr, F32, U64]).unwrap_err();
        assert!(
            e.contains("takes (ptr, f32, u32) but the launch passes (ptr, f32, u64)"),
            "{e}"
        );
        let e = check("dropout_fwd", &[Ptr, Ptr, U32, F32, U64, Ptr, U32]).unwrap_err();
        assert!(e.contains("dropout_fwd"), "{e}");
        assert!(check("no_such_kernel", &[]).is_err());
    }
}
