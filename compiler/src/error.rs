//! The compiler crate's error type.

/// Every error the compiler reports. Each names what it is about (function,
/// value, parameter or leaf) so the user can find it.
#[derive(Debug, thiserror::Error)]
pub enum CompilerError {
    /// Differentiation was asked for something it cannot do.
    #[error("autodiff of @{func}: {message}")]
    Autodiff {
        /// The function being differentiated.
        func: String,
        /// What is wrong.
        message: String,
    },
    /// An error from the IR (e.g. a transform's input failed verification).
    #[error(transparent)]
    Ir(#[from] weft_ir::IrError),
}
