//! Strided views: when consecutive dimensions of a view are laid out as
//! one. Both dot products that read operands in place (the fast CPU
//! backend's GEMM calls and the CubeCL backend's cubek launches) ask this
//! of each operand's free, contracting and batch groups.

/// Collapses consecutive dims `dims` of a view (shape, strides) into one
/// stride, if they are laid out as one (dimensions of extent 1 never
/// matter; all of extent 1 give stride 0).
pub(crate) fn collapse(shape: &[usize], strides: &[isize], dims: std::ops::Range<usize>) -> Option<isize> {
    let mut stride: Option<isize> = None;
    let mut expect: Option<isize> = None;
    for d in dims.rev() {
        if shape[d] == 1 {
            continue;
        }
        match expect {
            None => stride = Some(strides[d]),
            Some(e) if e == strides[d] => {}
            Some(_) => return None,
        }
        expect = Some(strides[d] * shape[d] as isize);
    }
    Some(stride.unwrap_or(0))
}

#[cfg(test)]
mod tests {
    use super::collapse;

    #[test]
    fn groups_collapse_when_laid_out_as_one() {
        // A [2, 3, 4] row-major buffer: the last two collapse, the first two
        // too, and a transposed pair does not.
        let (shape, strides) = ([2, 3, 4], [12, 4, 1]);
        assert_eq!(collapse(&shape, &strides, 1..3), Some(1));
        assert_eq!(collapse(&shape, &strides, 0..2), Some(4));
        assert_eq!(collapse(&[4, 3], &[1, 4], 0..2), None);
        assert_eq!(collapse(&[1, 1], &[5, 7], 0..2), Some(0));
        assert_eq!(collapse(&[3, 1, 4], &[4, 99, 1], 0..3), Some(1));
    }
}
