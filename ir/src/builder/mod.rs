//! Ergonomic construction of IR functions, after XLA's `XlaBuilder`.
//!
//! Writing models as raw [`Op`](crate::Op)s means computing every result
//! type, inserting every `broadcast_in_dim` and checking every axis by hand.
//! The builder does that work once:
//!
//! * [`FunctionBuilder`] builds one function. Every op method takes `&self`
//!   and [`Value`] handles (`Copy`) and returns a `Value`, so calls nest:
//!   `f.add(f.matmul(x, w), b)`. Result types always come from
//!   [`crate::infer()`]; the builder never restates a type rule.
//! * Mistakes do not return `Result`s at every call. The **first** error is
//!   kept (sticky) with the op's name and the caller's `file:line:col`
//!   (captured with `#[track_caller]`), later calls return placeholder
//!   values and add nothing, and [`FunctionBuilder::finish`] reports it as
//!   [`IrError::Builder`](crate::IrError::Builder). `finish` also runs the
//!   verifier, so a finished function is always well-formed.
//! * Binary, comparison and select helpers broadcast NumPy-style (shapes are
//!   right-aligned, size-1 dimensions stretch), which the IR itself never
//!   does: the builder inserts the explicit `reshape`/`broadcast_in_dim`.
//! * Composite helpers (`softmax`, `layer_norm`, `matmul`, losses, ...)
//!   expand into primitives, so later passes (autodiff, sharding, the
//!   interpreter) only ever see the closed op set.
//! * [`ModuleBuilder`] collects functions that call each other; a function
//!   can call any function added to the module before it was started.
//! * Random numbers (`random_uniform`, `dropout`, ...) take a `u32[2]`
//!   Threefry key value and expand into u32 ops (see [`crate::prng_emit`]).
//! * [`FunctionBuilder::emit`] appends any [`Op`](crate::Op) with inferred
//!   result types, for code that copies or transforms instructions.
//!
//! Axes of composite helpers are `isize` and may be negative (counted from
//! the end, as in NumPy); attributes of primitive ops are exact `usize`
//! dimension numbers, as in the IR.
//!
//! ```
//! use weft_ir::builder::FunctionBuilder;
//! use weft_ir::DType::F32;
//!
//! let f = FunctionBuilder::new("mlp");
//! let x = f.param("x", F32, &[8, 16]);
//! let w = f.param("w", F32, &[16, 4]);
//! let b = f.param("b", F32, &[4]);
//! let y = f.relu(f.linear(x, w, Some(b)));
//! f.set_results(&[f.name(y, "y")]);
//! let func = f.finish().unwrap();
//! assert_eq!(func.result_types()[0].to_string(), "f32[8,4]");
//! ```

mod composite;
mod constants;
mod core;
mod elementwise;
mod indexing;
mod linalg;
mod loss;
mod module;
mod moe;
mod params;
mod random;
mod reduce;
mod shape;
mod transformer;

pub use self::core::{FunctionBuilder, Value};
pub use self::module::ModuleBuilder;
pub use self::moe::{moe_capacity, MoeOutput};
pub use self::shape::broadcast_shapes;
