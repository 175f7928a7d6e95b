//! The static memory plan: every tensor of a trial as a region of one arena, sized before step 0.

use serde::Serialize;

use crate::engine::Region;

/// What a planned tensor is for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub enum MemKind {
    Params,
    Grads,
    OptState,
    Activations,
    Workspace,
}

impl MemKind {
    pub const ALL: [MemKind; 5] = [
        MemKind::Params,
        MemKind::Grads,
        MemKind::OptState,
        MemKind::Activations,
        MemKind::Workspace,
    ];
    pub fn name(&self) -> &'static str {
        match self {
            MemKind::Params => "parameters",
            MemKind::Grads => "gradients",
            MemKind::OptState => "optimiser state",
            MemKind::Activations => "activations",
            MemKind::Workspace => "workspace",
        }
    }
}

/// One planned tensor.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct PlanEntry {
    pub name: String,
    pub kind: MemKind,
    pub region: Region,
}

/// Regions start on 64-element (256-byte) boundaries, as device allocators align.
pub const ALIGN: usize = 64;

/// All of a trial's tensors, laid out one after another in a single arena.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct MemoryPlan {
    pub entries: Vec<PlanEntry>,
    /// Arena length in `f32` elements.
    pub total: usize,
}

impl MemoryPlan {
    /// Reserves `len` elements for a named tensor and returns its region.
    pub fn add(&mut self, name: impl Into<String>, kind: MemKind, len: usize) -> Region {
        let offset = self.total.div_ceil(ALIGN) * ALIGN;
        let region = Region::new(offset, len);
        self.total = offset + len;
        self.entries.push(PlanEntry {
            name: name.into(),
            kind,
            region,
        });
        region
    }

    /// Reserves `len` elements right after the last tensor, without aligning them: for small
    /// tensors read together with the one before them.
    pub fn add_next(&mut self, name: impl Into<String>, kind: MemKind, len: usize) -> Region {
        let region = Region::new(self.total, len);
        self.total += len;
        self.entries.push(PlanEntry {
            name: name.into(),
            kind,
            region,
        });
        region
    }

    /// The arena's size in bytes.
    pub fn bytes(&self) -> usize {
        self.total * std::mem::size_of::<f32>()
    }

    /// Bytes planned for one kind of tensor.
    pub fn bytes_of(&self, kind: MemKind) -> usize {
        self.entries
            .iter()
            .filter(|e| e.kind == kind)
            .map(|e| e.region.len * std::mem::size_of::<f32>())
            .sum()
    }

    /// A one-line breakdown, e.g. `parameters 0.4 MiB, gradients 0.4 MiB, ...`.
    pub fn summary(&self) -> String {
        let mib = |b: usize| b as f64 / (1u64 << 20) as f64;
        let parts: Vec<String> = MemKind::ALL
            .iter()
            .map(|k| format!("{} {:.2} MiB", k.name(), mib(self.bytes_of(*k))))
            .collect();
        format!("{:.2} MiB in all: {}", mib(self.bytes()), parts.join(", "))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn regions_are_aligned_and_disjoint() {
        let mut p = MemoryPlan::default();
        let a = p.add("a", MemKind::Params, 10);
        let b = p.add("b", MemKind::Grads, 100);
        let c = p.add("c", MemKind::Params, 1);
        assert_eq!(a.offset, 0);
        assert_eq!(b.offset, 64);
        assert_eq!(c.offset, 192);
        assert!(!a.overlaps(&b) && !b.overlaps(&c));
        assert_eq!(p.total, 193);
        assert_eq!(p.bytes_of(MemKind::Params), 44);
        assert!(p.summary().contains("gradients 0.00 MiB"));
    }
}
