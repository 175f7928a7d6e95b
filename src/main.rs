//! The `gpumux` command line: a thin clap layer over the library.
fn main() {}
