//! The flame graphs' data: the folded stacks of [`crate::report::folded`]
//! (the same data as `--format folded|svg`) merged into a tree. Nodes
//! narrower than [`MIN_NODE_SHARE`] of the total are left out of the tree
//! (their weight stays in their parent's total, so the root's value is the
//! whole profile); how many were left out is said on the page.

use std::collections::HashMap;

use serde::Serialize;

use crate::{
    recording::Recording,
    report::folded::{fold, Profile},
};

/// Nodes under this share of the profile are not drawn (1/2000: under a
/// pixel at any screen width the page is read at).
const MIN_NODE_SHARE: f64 = 0.0005;
/// At most this many nodes per flame graph (deep and wide profiles): the
/// threshold doubles until the tree fits (the page says how many were left out).
const MAX_NODES: usize = 20_000;

/// One flame graph.
#[derive(Serialize)]
pub struct Flame {
    /// `cpu`, `off-cpu`, `wall`, `memory` (as `--profile`).
    pub profile: &'static str,
    pub title: &'static str,
    /// Unit of the values: samples, us, bytes.
    pub unit: &'static str,
    /// The sum of every stack's weight: the recording's total for the profile.
    pub total: u64,
    /// Frame names, indexed by the tree's nodes.
    pub names: Vec<String>,
    /// The tree in pre-order, `[name index, value, depth]` each (flat: no
    /// nesting limit for a JSON reader), the root first (name "all", depth
    /// 0), heavier children before lighter ones.
    pub nodes: Vec<Node>,
    /// Nodes left out for being narrower than 1/2000 of the total.
    pub pruned: u64,
}

/// `[name, value, depth]` (serialised as an array: compact).
#[derive(Serialize)]
pub struct Node(pub u32, pub u64, pub u32);

#[derive(Default)]
struct Build {
    value: u64,
    children: Vec<(String, Build)>,
}

impl Build {
    fn child(&mut self, name: &str) -> &mut Build {
        let i = match self.children.iter().position(|(n, _)| n == name) {
            Some(i) => i,
            None => {
                self.children.push((name.to_owned(), Build::default()));
                self.children.len() - 1
            }
        };
        &mut self.children[i].1
    }
}

struct Names {
    list: Vec<String>,
    index: HashMap<String, u32>,
}

impl Names {
    fn of(&mut self, name: &str) -> u32 {
        if let Some(i) = self.index.get(name) {
            return *i;
        }
        let i = u32::try_from(self.list.len()).unwrap_or(u32::MAX);
        self.list.push(name.to_owned());
        self.index.insert(name.to_owned(), i);
        i
    }
}

/// The flame graph of `rec` for `profile`, or None when it has no stacks.
pub fn of(rec: &Recording, profile: Profile) -> Option<Flame> {
    let mut root = Build::default();
    for (stack, weight) in fold(rec, profile) {
        root.value = root.value.saturating_add(weight);
        let mut node = &mut root;
        for frame in stack.split(';') {
            node = node.child(frame);
            node.value = node.value.saturating_add(weight);
        }
    }
    if root.value == 0 {
        return None;
    }
    let mut min = (root.value as f64 * MIN_NODE_SHARE).ceil().max(1.0) as u64;
    while kept(&root, min) > MAX_NODES {
        min = min.saturating_mul(2);
    }
    let mut names = Names { list: Vec::new(), index: HashMap::new() };
    let mut pruned = 0;
    let all = names.of("all");
    let mut nodes = vec![Node(all, root.value, 0)];
    finish(root.children, 1, min, &mut names, &mut pruned, &mut nodes);
    Some(Flame {
        profile: match profile {
            Profile::Cpu => "cpu",
            Profile::OffCpu => "off-cpu",
            Profile::Wall => "wall",
            Profile::Memory => "memory",
        },
        title: profile.title(),
        unit: profile.unit(),
        total: root.value,
        names: names.list,
        nodes,
        pruned,
    })
}

fn finish(children: Vec<(String, Build)>, depth: u32, min: u64, names: &mut Names, pruned: &mut u64, out: &mut Vec<Node>) {
    let mut kept: Vec<(String, Build)> = Vec::new();
    for (name, b) in children {
        if b.value < min {
            *pruned += 1 + count(&b);
        } else {
            kept.push((name, b));
        }
    }
    // Heaviest first, then by name: a stable picture of the same data.
    kept.sort_by(|a, b| b.1.value.cmp(&a.1.value).then_with(|| a.0.cmp(&b.0)));
    for (name, b) in kept {
        let i = names.of(&name);
        out.push(Node(i, b.value, depth));
        finish(b.children, depth + 1, min, names, pruned, out);
    }
}

/// Nodes of `b`'s tree at least `min` heavy (children of a lighter node are lighter still).
fn kept(b: &Build, min: u64) -> usize {
    b.children.iter().filter(|(_, c)| c.value >= min).map(|(_, c)| 1 + kept(c, min)).sum()
}

fn count(b: &Build) -> u64 {
    b.children.iter().map(|(_, c)| 1 + count(c)).sum()
}

/// The flame graphs the recording has data for: CPU, off-CPU, wall, and
/// resident memory growth.
pub fn all(rec: &Recording) -> Vec<Flame> {
    [Profile::Cpu, Profile::OffCpu, Profile::Wall, Profile::Memory].into_iter().filter_map(|p| of(rec, p)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::recording::{Frame, FrameKind, StackKind, StackRecord, ThreadTimes};

    fn frame(f: &str) -> Frame {
        Frame { function: f.into(), file: None, line: None, kind: FrameKind::Python, module: None }
    }

    #[test]
    fn the_root_is_the_whole_profile_and_thin_nodes_are_counted() {
        let mut rec = crate::recording::tests::sample();
        rec.stacks.clear();
        rec.threads.push(ThreadTimes { pid: 1, tid: 1, comm: "p".into(), ..Default::default() });
        let stack = |frames: &[&str], samples| StackRecord {
            kind: StackKind::Cpu,
            reason: None,
            pid: 1,
            tid: 1,
            samples,
            weight_ns: 0,
            syscall: None,
            // Leaf first, as the recording keeps them.
            frames: frames.iter().map(|f| frame(f)).collect(),
        };
        rec.stacks.push(stack(&["hot", "main"], 9000));
        rec.stacks.push(stack(&["cold", "main"], 999));
        rec.stacks.push(stack(&["thin", "main"], 1));
        let f = of(&rec, Profile::Cpu).unwrap();
        assert_eq!(f.total, 10_000);
        assert_eq!(f.pruned, 1, "the 1-sample node is under 1/2000");
        let shown: Vec<(&str, u64, u32)> = f.nodes.iter().map(|n| (f.names[n.0 as usize].as_str(), n.1, n.2)).collect();
        let process = shown[1].0;
        assert_eq!(shown, vec![("all", 10_000, 0), (process, 10_000, 1), ("main", 10_000, 2), ("hot", 9000, 3), ("cold", 999, 3)]);
        assert!(of(&rec, Profile::OffCpu).is_none());
    }

    #[test]
    fn a_deep_wide_profile_is_capped() {
        let mut rec = crate::recording::tests::sample();
        rec.stacks.clear();
        // 100 stacks of 300 distinct frames, 1% each: 30,000 nodes over the cap.
        for s in 0..100 {
            rec.stacks.push(StackRecord {
                kind: StackKind::Cpu,
                reason: None,
                pid: 1,
                tid: 1,
                samples: 10 + s,
                weight_ns: 0,
                syscall: None,
                frames: (0..300).map(|d| frame(&format!("s{s}d{d}"))).collect(),
            });
        }
        let f = of(&rec, Profile::Cpu).unwrap();
        assert!(f.nodes.len() <= MAX_NODES + 1, "{} nodes", f.nodes.len());
        assert!(f.nodes.len() > MAX_NODES / 4, "the heaviest stacks stay: {} nodes", f.nodes.len());
        assert_eq!(f.total, (10..110).sum::<u64>());
        assert_eq!(f.nodes.len() as u64 + f.pruned, 1 + 1 + 100 * 300, "every node drawn or counted");
    }
}
