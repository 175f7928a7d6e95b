//! Each kernel's parameter types, read from its CUDA source, so a launch whose arguments do not match them fails with an error instead of corrupting memory.

use std::collections::HashMap;
use std::sync::OnceLock;

use super::kernels::MODULES;

/// A kernel parameter as a launch passes it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ParamKind {
    /// A device pointer (any `T*`).
    Ptr,
    /// `unsigned int` or `int`.
    U32,
    F32,
    /// `u64` or `unsigned long long`.
    U64,
}

impl ParamKind {
    pub fn name(self) -> &'static str {
        match self {
            ParamKind::Ptr => "ptr",
            ParamKind::U32 => "u32",
            ParamKind::F32 => "f32",
            ParamKind::U64 => "u64",
        }
    }
}

/// The kind of one parameter declaration (`const float* x`, `unsigned int n`, `u64 seed`).
fn kind_of(decl: &str) -> Result<ParamKind, String> {
    if decl.contains('*') {
        return Ok(ParamKind::Ptr);
    }
    let words: Vec<&str> = decl.split_whitespace().collect();
    let Some((_, ty)) = words.split_last() else {
        return Err("an empty parameter".into());
    };
    let ty: Vec<&str> = ty.iter().copied().filter(|w| *w != "const").collect();
    match ty.as_slice() {
        ["unsigned", "int"] | ["unsigned"] | ["int"] | ["u32"] => Ok(ParamKind::U32),
        ["float"] => Ok(ParamKind::F32),
        ["u64"] | ["unsigned", "long", "long"] => Ok(ParamKind::U64),
        _ => Err(format!("`{}` has a type launches do not pass", decl.trim())),
    }
}

/// Every `extern "C" __global__` kernel of `source` with its parameters, in order.
pub fn parse(source: &str) -> Result<Vec<(String, Vec<ParamKind>)>, String> {
    let mut out = Vec::new();
    let mut rest = source;
    while let Some(at) = rest.find("__global__") {
        rest = &rest[at + "__global__".len()..];
        let head = rest.trim_start();
        let head = head
            .strip_prefix("void")
            .ok_or_else(|| "a __global__ function that does not return void".to_string())?;
        let mut head = head.trim_start();
        if let Some(after) = head.strip_prefix("__launch_bounds__") {
            let close = after
                .find(')')
                .ok_or("an unclosed __launch_bounds__".to_string())?;
            head = after[close + 1..].trim_start();
        }
        let open = head
            .find('(')
            .ok_or("a kernel without parameters".to_string())?;
        let name = head[..open].trim().to_string();
        let close = head[open..]
            .find(')')
            .ok_or_else(|| format!("kernel {name}: unclosed parameter list"))?;
        let list = &head[open + 1..open + close];
        let kinds = if list.trim().is_empty() || list.trim() == "void" {
            Vec::new()
        } else {
            list.split(',')
                .map(|d| kind_of(d).map_err(|e| format!("kernel {name}: {e}")))
                .collect::<Result<Vec<_>, _>>()?
        };
        out.push((name, kinds));
        rest = &head[open + close..];
    }
    Ok(out)
}

/// The parameters of kernel `name` of the built-in modules, when its source declares it and
/// every parameter's type is one a launch passes.
pub fn of(name: &str) -> Option<&'static [ParamKind]> {
    static ALL: OnceLock<HashMap<String, Vec<ParamKind>>> = OnceLock::new();
    ALL.get_or_init(|| {
        MODULES
            .iter()
            .filter_map(|m| parse(m.source).ok())
            .flatten()
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
            let names: Vec<&str> = parsed.iter().map(|(n, _)| n.as_str()).collect();
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
            Ok(vec![
                ("k".into(), vec![Ptr, U64, U32]),
                ("none".into(), vec![])
            ])
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
            let parsed = parse(&format!("__global__ void {sig} {{}}")).unwrap_or_default();
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
