//! Constant tensor values carried by the `constant` op.
//!
//! Elements are held as `f64`, which represents every value of every weft
//! dtype exactly (f32, bf16, f16, i32, u32, bool as 0/1). Values are rounded
//! to the literal's dtype when the literal is built, so a literal always holds
//! exactly what the program computes with.

use crate::{DType, TensorType};

/// The elements of a literal: one value broadcast to the whole shape, or one
/// value per element in row-major order.
///
/// Equality compares values bitwise, except that every NaN equals every NaN
/// (so a constant equals itself and `-0.0` differs from `0.0`).
#[derive(Clone, Debug)]
pub enum LiteralData {
    /// Every element has this value.
    Splat(f64),
    /// One value per element, row-major.
    Dense(Vec<f64>),
}

impl PartialEq for LiteralData {
    fn eq(&self, other: &LiteralData) -> bool {
        let same = |a: &f64, b: &f64| a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan());
        match (self, other) {
            (LiteralData::Splat(a), LiteralData::Splat(b)) => same(a, b),
            (LiteralData::Dense(a), LiteralData::Dense(b)) => {
                a.len() == b.len() && a.iter().zip(b).all(|(a, b)| same(a, b))
            }
            _ => false,
        }
    }
}

/// A constant tensor.
#[derive(Clone, Debug, PartialEq)]
pub struct Literal {
    /// Type of the constant.
    pub ty: TensorType,
    /// Its elements.
    pub data: LiteralData,
}

impl Literal {
    /// A splat constant: every element equals `value`, rounded to `ty.dtype`.
    pub fn splat(ty: TensorType, value: f64) -> Literal {
        let v = ty.dtype.round(value);
        Literal { ty, data: LiteralData::Splat(v) }
    }

    /// A scalar constant.
    pub fn scalar(dtype: DType, value: f64) -> Literal {
        Literal::splat(TensorType::scalar(dtype), value)
    }

    /// A dense constant. Returns an error message if the number of values
    /// does not match the shape.
    pub fn dense(ty: TensorType, values: Vec<f64>) -> Result<Literal, String> {
        if values.len() != ty.num_elements() {
            return Err(format!(
                "dense constant of type {ty} needs {} values, got {}",
                ty.num_elements(),
                values.len()
            ));
        }
        let values = values.into_iter().map(|v| ty.dtype.round(v)).collect();
        Ok(Literal { ty, data: LiteralData::Dense(values) })
    }

    /// The value of element `i` (row-major).
    pub fn get(&self, i: usize) -> f64 {
        match &self.data {
            LiteralData::Splat(v) => *v,
            LiteralData::Dense(vs) => vs[i],
        }
    }

    /// All elements, row-major.
    pub fn to_vec(&self) -> Vec<f64> {
        match &self.data {
            LiteralData::Splat(v) => vec![*v; self.ty.num_elements()],
            LiteralData::Dense(vs) => vs.clone(),
        }
    }
}

/// Values compared bitwise so that NaN constants compare equal to themselves
/// (needed for exact round-trip tests).
impl Eq for Literal {}
