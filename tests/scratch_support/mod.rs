//! A scratch directory that removes itself: tests that write runs,
//! checkpoints and configs leave nothing behind in the system's temporary
//! directory (a dev machine's `/tmp` used to collect hundreds of them).

use std::path::Path;

/// A fresh directory under the system's temporary directory, named for the
/// test (`weft-{prefix}-{name}-…`), removed with everything in it when
/// dropped. Dereferences to its path.
pub struct Scratch(tempfile::TempDir);

impl Scratch {
    /// A new, empty scratch directory.
    pub fn new(prefix: &str, name: &str) -> Scratch {
        let dir = tempfile::Builder::new().prefix(&format!("weft-{prefix}-{name}-")).tempdir().expect("a scratch dir");
        Scratch(dir)
    }
}

impl std::ops::Deref for Scratch {
    type Target = Path;

    fn deref(&self) -> &Path {
        self.0.path()
    }
}

impl AsRef<Path> for Scratch {
    fn as_ref(&self) -> &Path {
        self.0.path()
    }
}
