//! Host tensors (being written).
