//! What a `reshard` costs: the collectives that implement it.
//!
//! A reshard from one sharding to another is classified axis by axis, as
//! Shardy's reshard-to-collectives pass and PyTorch DTensor's `redistribute`
//! do: an axis that stops splitting a dimension is an all-gather; one that
//! starts splitting it is a local slice (no communication); a pending sum
//! that is resolved is an all-reduce, or a reduce-scatter when the axis
//! then splits a dimension; an axis that moves from one dimension to
//! another is an all-to-all; when a dimension keeps its number of blocks
//! but the axes after the common prefix are reordered or replaced by axes
//! of the same total size, blocks only move between devices: a collective
//! permute. The cost model
//! (`latency + bytes / bandwidth` per collective, with the byte counts of
//! ring algorithms) is what propagation uses to prefer the choice needing
//! less communication; the SPMD partitioner lowers the same plan.

use super::mesh::Mesh;
use super::spec::MeshSharding;
use weft_ir::TensorType;

/// One collective (or local) operation of a reshard plan.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Collective {
    /// Keep only this device's block of `dim` along `axes` (no communication).
    LocalSlice {
        /// Axes that start splitting the dimension.
        axes: Vec<usize>,
        /// The dimension.
        dim: usize,
    },
    /// Sum partial values over `axes` and keep one block of `dim`.
    ReduceScatter {
        /// Axes summed over, then splitting the dimension.
        axes: Vec<usize>,
        /// The dimension.
        dim: usize,
    },
    /// Sum partial values over `axes`.
    AllReduce {
        /// Axes summed over.
        axes: Vec<usize>,
    },
    /// Move the split along `axes` from dimension `from` to `to`.
    AllToAll {
        /// Axes that move.
        axes: Vec<usize>,
        /// Dimension they split before.
        from: usize,
        /// Dimension they split after.
        to: usize,
    },
    /// Exchange blocks between devices because the order of `axes` in
    /// `dim` changes (or, for a reshard that only changes which device holds
    /// which block, because `axes` change places; `dim` is then the first
    /// dimension that changes).
    CollectivePermute {
        /// Axes that change position.
        axes: Vec<usize>,
        /// The dimension.
        dim: usize,
    },
    /// Gather the blocks of `dim` along `axes`.
    AllGather {
        /// Axes that stop splitting the dimension.
        axes: Vec<usize>,
        /// The dimension.
        dim: usize,
    },
    /// Turn a full value into partial values over `axes` (local: one device
    /// of each group keeps the value, the others hold zeros).
    LocalUnreduce {
        /// Axes the value becomes a pending sum over.
        axes: Vec<usize>,
    },
}

impl Collective {
    /// Whether it moves data between devices.
    pub fn communicates(&self) -> bool {
        !matches!(self, Collective::LocalSlice { .. } | Collective::LocalUnreduce { .. })
    }

    /// The mesh axes it runs over.
    pub fn axes(&self) -> &[usize] {
        match self {
            Collective::LocalSlice { axes, .. }
            | Collective::ReduceScatter { axes, .. }
            | Collective::AllReduce { axes }
            | Collective::AllToAll { axes, .. }
            | Collective::CollectivePermute { axes, .. }
            | Collective::AllGather { axes, .. }
            | Collective::LocalUnreduce { axes } => axes,
        }
    }

    /// The mesh axes it runs over, to extend.
    fn axes_mut(&mut self) -> &mut Vec<usize> {
        match self {
            Collective::LocalSlice { axes, .. }
            | Collective::ReduceScatter { axes, .. }
            | Collective::AllReduce { axes }
            | Collective::AllToAll { axes, .. }
            | Collective::CollectivePermute { axes, .. }
            | Collective::AllGather { axes, .. }
            | Collective::LocalUnreduce { axes } => axes,
        }
    }

    /// Short text form with axis names, e.g. `all-gather{model} dim 1`.
    pub fn describe(&self, mesh: &Mesh) -> String {
        let names: Vec<&str> = self.axes().iter().map(|&a| mesh.name(a)).collect();
        let ax = format!("{{{}}}", names.join(", "));
        match self {
            Collective::LocalSlice { dim, .. } => format!("local-slice{ax} dim {dim}"),
            Collective::ReduceScatter { dim, .. } => format!("reduce-scatter{ax} dim {dim}"),
            Collective::AllReduce { .. } => format!("all-reduce{ax}"),
            Collective::AllToAll { from, to, .. } => format!("all-to-all{ax} dim {from}->{to}"),
            Collective::CollectivePermute { dim, .. } => format!("collective-permute{ax} dim {dim}"),
            Collective::AllGather { dim, .. } => format!("all-gather{ax} dim {dim}"),
            Collective::LocalUnreduce { .. } => format!("local-unreduce{ax}"),
        }
    }

    fn order(&self) -> u8 {
        match self {
            Collective::LocalSlice { .. } => 0,
            Collective::ReduceScatter { .. } => 1,
            Collective::AllReduce { .. } => 2,
            Collective::AllToAll { .. } => 3,
            Collective::CollectivePermute { .. } => 4,
            Collective::AllGather { .. } => 5,
            Collective::LocalUnreduce { .. } => 6,
        }
    }
}

/// The collectives implementing one reshard, in execution order, and their
/// estimated cost.
#[derive(Clone, Debug, PartialEq)]
pub struct ReshardPlan {
    /// Steps in order.
    pub steps: Vec<Collective>,
    /// Estimated cost: seconds when the mesh has link parameters, otherwise
    /// bytes moved per device (bandwidth 1, latency 0).
    pub cost: f64,
}

impl ReshardPlan {
    /// Whether the plan moves any data.
    pub fn communicates(&self) -> bool {
        self.steps.iter().any(Collective::communicates)
    }

    /// The steps with axis names, e.g. `["all-gather{model} dim 1"]`.
    pub fn describe(&self, mesh: &Mesh) -> Vec<String> {
        self.steps.iter().map(|c| c.describe(mesh)).collect()
    }
}

#[derive(Copy, Clone, PartialEq, Eq)]
enum Role {
    None,
    Dim(usize, usize),
    Unreduced,
}

fn roles(s: &MeshSharding, n: usize) -> Vec<Role> {
    let mut r = vec![Role::None; n];
    for (d, dim) in s.dims.iter().enumerate() {
        for (p, &a) in dim.axes.iter().enumerate() {
            r[a] = Role::Dim(d, p);
        }
    }
    for &a in &s.unreduced {
        r[a] = Role::Unreduced;
    }
    r
}

/// Plans the reshard of a value of type `ty` from `from` to `to` on `mesh`.
pub fn plan_reshard(ty: &TensorType, from: &MeshSharding, to: &MeshSharding, mesh: &Mesh) -> ReshardPlan {
    let n = mesh.axes().len();
    let (rf, rt) = (roles(from, n), roles(to, n));
    let mut steps: Vec<Collective> = Vec::new();
    let mut push = |c: Collective| {
        // Merge with an earlier step of the same kind and place.
        for s in steps.iter_mut() {
            let same = match (&*s, &c) {
                (Collective::AllReduce { .. }, Collective::AllReduce { .. })
                | (Collective::LocalUnreduce { .. }, Collective::LocalUnreduce { .. }) => true,
                (Collective::LocalSlice { dim: a, .. }, Collective::LocalSlice { dim: b, .. })
                | (Collective::ReduceScatter { dim: a, .. }, Collective::ReduceScatter { dim: b, .. })
                | (Collective::CollectivePermute { dim: a, .. }, Collective::CollectivePermute { dim: b, .. })
                | (Collective::AllGather { dim: a, .. }, Collective::AllGather { dim: b, .. }) => a == b,
                (Collective::AllToAll { from: a, to: b, .. }, Collective::AllToAll { from: c2, to: d2, .. }) => {
                    a == c2 && b == d2
                }
                _ => false,
            };
            if same {
                let extra = c.axes().to_vec();
                s.axes_mut().extend(extra);
                return;
            }
        }
        steps.push(c);
    };
    for d in 0..from.rank().min(to.rank()) {
        let (fa, ta) = (&from.dims[d].axes, &to.dims[d].axes);
        let common = fa.iter().zip(ta).take_while(|(a, b)| a == b).count();
        let (rest_f, rest_t) = (&fa[common..], &ta[common..]);
        // Same block count, axes that stay within this dimension: the blocks
        // only move between devices (axes reordered, or replaced by axes of
        // the same size).
        let here = |r: Role| r == Role::None || matches!(r, Role::Dim(x, _) if x == d);
        let stays = |a: &usize| here(rt[*a]) && here(rf[*a]);
        if !rest_f.is_empty() && mesh.product(rest_f) == mesh.product(rest_t) && rest_f.iter().chain(rest_t).all(stays)
        {
            let mut axes: Vec<usize> = rest_f.to_vec();
            axes.extend(rest_t.iter().filter(|a| !rest_f.contains(a)));
            push(Collective::CollectivePermute { axes, dim: d });
            continue;
        }
        for &a in rest_f {
            match rt[a] {
                Role::None => push(Collective::AllGather { axes: vec![a], dim: d }),
                Role::Unreduced => {
                    push(Collective::AllGather { axes: vec![a], dim: d });
                    push(Collective::LocalUnreduce { axes: vec![a] });
                }
                Role::Dim(d2, _) if d2 != d => push(Collective::AllToAll { axes: vec![a], from: d, to: d2 }),
                Role::Dim(..) => push(Collective::CollectivePermute { axes: vec![a], dim: d }),
            }
        }
        for &a in rest_t {
            match rf[a] {
                Role::None => push(Collective::LocalSlice { axes: vec![a], dim: d }),
                Role::Unreduced => push(Collective::ReduceScatter { axes: vec![a], dim: d }),
                Role::Dim(..) => {} // counted from the source side
            }
        }
    }
    for a in 0..n {
        match (rf[a], rt[a]) {
            (Role::Unreduced, Role::None) => push(Collective::AllReduce { axes: vec![a] }),
            (Role::None, Role::Unreduced) => push(Collective::LocalUnreduce { axes: vec![a] }),
            _ => {}
        }
    }
    steps.sort_by_key(Collective::order);
    let local_bytes = from.local_shape(&ty.shape, mesh).iter().product::<usize>() * ty.dtype.size_bytes();
    let cost = plan_cost(&steps, local_bytes, mesh);
    if let Some(permute) = whole_block_permute(from, to, mesh) {
        let communicating = steps.iter().filter(|s| s.communicates()).count();
        let permute_cost = plan_cost(std::slice::from_ref(&permute), local_bytes, mesh);
        if communicating > 1 || permute_cost <= cost {
            return ReshardPlan { steps: vec![permute], cost: permute_cost };
        }
    }
    ReshardPlan { steps, cost }
}

/// When `from` and `to` cut every dimension into the same number of blocks
/// and have the same pending sums, every block `to` needs is already on
/// some device: the reshard only changes which device holds which block
/// (`[{y}, {x}] -> [{x}, {y}]` on a square mesh), one collective permute.
/// Its `axes` are every axis whose place changes, `dim` the first dimension
/// whose axes change.
fn whole_block_permute(from: &MeshSharding, to: &MeshSharding, mesh: &Mesh) -> Option<Collective> {
    if from.rank() != to.rank() || from == to {
        return None;
    }
    let sorted = |v: &[usize]| {
        let mut v = v.to_vec();
        v.sort_unstable();
        v
    };
    if sorted(&from.unreduced) != sorted(&to.unreduced) {
        return None;
    }
    let same_blocks = from.dims.iter().zip(&to.dims).all(|(a, b)| mesh.product(&a.axes) == mesh.product(&b.axes));
    let dim = (0..from.rank()).find(|&d| from.dims[d].axes != to.dims[d].axes)?;
    if !same_blocks {
        return None;
    }
    let mut axes: Vec<usize> = Vec::new();
    for (a, b) in from.dims.iter().zip(&to.dims) {
        let common = a.axes.iter().zip(&b.axes).take_while(|(x, y)| x == y).count();
        for &x in a.axes[common..].iter().chain(&b.axes[common..]) {
            if !axes.contains(&x) {
                axes.push(x);
            }
        }
    }
    Some(Collective::CollectivePermute { axes, dim })
}

/// Cost of one collective moving `bytes` per device over `axes`.
pub fn link_cost(bytes: f64, axes: &[usize], mesh: &Mesh) -> f64 {
    let latency: f64 = axes.iter().map(|&a| mesh.axes()[a].latency.unwrap_or(0.0)).sum();
    let bw = axes.iter().map(|&a| mesh.axes()[a].bandwidth.unwrap_or(1.0)).fold(f64::INFINITY, f64::min);
    let bw = if bw.is_finite() { bw } else { 1.0 };
    latency + bytes / bw
}

/// Cost of all-reducing `bytes` per device over `axes` (ring: 2(n-1)/n).
pub fn all_reduce_cost(bytes: f64, axes: &[usize], mesh: &Mesh) -> f64 {
    let n = mesh.product(axes) as f64;
    if n <= 1.0 {
        return 0.0;
    }
    link_cost(2.0 * (n - 1.0) / n * bytes, axes, mesh)
}

fn plan_cost(steps: &[Collective], local_bytes: usize, mesh: &Mesh) -> f64 {
    let mut bytes = local_bytes as f64;
    let mut cost = 0.0;
    for s in steps {
        let n = mesh.product(s.axes()) as f64;
        let frac = (n - 1.0) / n;
        match s {
            Collective::LocalSlice { .. } => bytes /= n,
            Collective::ReduceScatter { axes, .. } => {
                cost += link_cost(frac * bytes, axes, mesh);
                bytes /= n;
            }
            Collective::AllReduce { axes } => cost += all_reduce_cost(bytes, axes, mesh),
            Collective::AllToAll { axes, .. } => cost += link_cost(frac * bytes, axes, mesh),
            Collective::CollectivePermute { axes, .. } => cost += link_cost(bytes, axes, mesh),
            Collective::AllGather { axes, .. } => {
                bytes *= n;
                cost += link_cost(frac * bytes, axes, mesh);
            }
            Collective::LocalUnreduce { .. } => {}
        }
    }
    cost
}
