//! Reshard -> collectives (Shardy export/test/reshard_to_collectives.mlir,
//! PyTorch DTensor `redistribute`), as listed in shared/reference-cases.md,
//! and the cost model.
mod common;
use common::{mesh, s};
use weft_compiler::sharding::{plan_reshard, Mesh, MeshSharding};
use weft_compiler::Site;
use weft_ir::{DType, TensorType};

fn plan(m: &Mesh, from: &str, to: &str) -> (Vec<String>, f64) {
    let ty = TensorType::new(DType::F32, vec![8, 8]);
    let site = Site::new("t", "v", None);
    let a = MeshSharding::resolve(&s(from), &ty, m, &site).unwrap();
    let b = MeshSharding::resolve(&s(to), &ty, m, &site).unwrap();
    let p = plan_reshard(&ty, &a, &b, m);
    (p.steps.iter().map(|c| c.describe(m)).collect(), p.cost)
}

#[test]
fn reference_table() {
    let m = mesh("x=2,y=2");
    // Replicated -> sharded: local slice, no communication.
    assert_eq!(plan(&m, "[{}, {}]", "[{x}, {}]"), (vec!["local-slice{x} dim 0".into()], 0.0));
    // Sharded -> replicated: all-gather.
    assert_eq!(plan(&m, "[{x}, {}]", "[{}, {}]").0, vec!["all-gather{x} dim 0"]);
    // Partial -> replicated: all-reduce. Partial -> sharded: reduce-scatter.
    assert_eq!(plan(&m, "[{}, {}] unreduced {x}", "[{}, {}]").0, vec!["all-reduce{x}"]);
    assert_eq!(plan(&m, "[{}, {}] unreduced {x}", "[{}, {x}]").0, vec!["reduce-scatter{x} dim 1"]);
    // Shard(dim i) -> Shard(dim j) on the same axis: all-to-all.
    assert_eq!(plan(&m, "[{x}, {}]", "[{}, {x}]").0, vec!["all-to-all{x} dim 0->1"]);
    // Same dims, axes reordered / device order changed: collective-permute.
    assert_eq!(plan(&m, "[{x, y}, {}]", "[{y, x}, {}]").0, vec!["collective-permute{x, y} dim 0"]);
    assert_eq!(plan(&m, "[{x}, {}]", "[{y}, {}]").0, vec!["collective-permute{x, y} dim 0"]);
    // Nothing to do.
    assert_eq!(plan(&m, "[{x}, {y}]", "[{x}, {y}]"), (vec![], 0.0));
    // Mixed: gather the minor axis only.
    assert_eq!(plan(&m, "[{x, y}, {}]", "[{x}, {}]").0, vec!["all-gather{y} dim 0"]);
}

// Ring costs: all-gather and reduce-scatter move (n-1)/n of the larger
// buffer, all-reduce 2(n-1)/n; with link parameters, latency + bytes/bandwidth.
#[test]
fn costs() {
    let m = mesh("x=2,y=2");
    // f32[8,8] = 256 bytes; [{x},{}] holds 128 per device, gathered 256.
    assert_eq!(plan(&m, "[{x}, {}]", "[{}, {}]").1, 128.0);
    assert_eq!(plan(&m, "[{}, {}] unreduced {x}", "[{}, {}]").1, 256.0);
    assert_eq!(plan(&m, "[{}, {}] unreduced {x, y}", "[{}, {}]").1, 384.0);
    assert_eq!(plan(&m, "[{}, {}] unreduced {x}", "[{x}, {}]").1, 128.0);
    let slow = mesh("x=2,y=2").with_link("x", 100.0, 1.0).unwrap();
    assert!((plan(&slow, "[{x}, {}]", "[{}, {}]").1 - 2.28).abs() < 1e-12);
}
