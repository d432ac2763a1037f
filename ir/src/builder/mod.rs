//! Ergonomic construction of IR functions (being written).
