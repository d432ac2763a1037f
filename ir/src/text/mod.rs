//! The text format (being written).
